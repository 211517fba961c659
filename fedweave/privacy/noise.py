"""Gaussian noise and Poisson masks from a secret, cryptographically secure source.

Whoever adds DP noise (the coordinator for ``--dp central``, each site for ``local`` and
``sample``) draws it here: AES-256-CTR under a fresh 256-bit key from the operating system's
CSPRNG (``os.urandom``) for every call, never a seed anyone else knows (a run's ``--seed``
travels with every round and is stored in the history: noise drawn from it can be subtracted).
Two runs with the same flags and seed therefore differ by their noise. Normal values come from
the Box-Muller transform of 53-bit uniforms, as Opacus's ``secure_mode`` and Google's DP
libraries draw theirs from a secure uniform source.
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_CHUNK = 1 << 20
"""Values drawn at a time (8 MB of keystream), so a large model's noise needs no second copy."""
_ZEROS = bytes(8 * _CHUNK)


class SecureRandom:
    """A stream of secure random values under one fresh secret key (``os.urandom``).

    The key lives in this object alone; nothing derives it from a seed, a round number or
    anything a message carries.
    """

    def __init__(self) -> None:
        key, nonce = os.urandom(32), os.urandom(16)
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()

    def uint64(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit unsigned integers."""
        out = np.empty(count, dtype=np.uint64)
        flat = out.view(np.uint8)
        done = 0
        while done < flat.size:
            step = min(len(_ZEROS), flat.size - done)
            flat[done : done + step] = np.frombuffer(
                self._encryptor.update(_ZEROS[:step]), dtype=np.uint8
            )
            done += step
        return out

    def uniform(self, count: int) -> np.ndarray:
        """``count`` uniform floats in (0, 1], 53 bits each (never 0: Box-Muller takes a log)."""
        return ((self.uint64(count) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53

    def normal(self, count: int, std: float) -> np.ndarray:
        """``count`` values of N(0, std²) (Box-Muller on secure uniforms), as float64."""
        out = np.empty(count, dtype=np.float64)
        for start in range(0, count, _CHUNK):
            n = min(_CHUNK, count - start)
            pairs = (n + 1) // 2
            u1, u2 = self.uniform(pairs), self.uniform(pairs)
            radius = np.sqrt(-2.0 * np.log(u1)) * std
            angle = 2.0 * np.pi * u2
            both = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])
            out[start : start + n] = both[:n]
        return out

    def poisson_mask(self, count: int, rate: float) -> np.ndarray:
        """``count`` independent draws that are ``True`` with probability ``rate``."""
        return self.uniform(count) <= rate


def secure_normal_like(arrays: list[np.ndarray], std: float) -> list[np.ndarray]:
    """N(0, std²) noise shaped like each of ``arrays`` (in their dtypes), from one fresh key."""
    source = SecureRandom()
    return [
        source.normal(int(np.prod(a.shape)), std).reshape(a.shape).astype(a.dtype, copy=False)
        for a in arrays
    ]


def add_secure_noise(arrays: list[np.ndarray], std: float) -> list[np.ndarray]:
    """``arrays`` each plus N(0, std²) noise from a fresh secret key (new arrays; floating
    tensors only: an integer tensor, such as a step counter, is no model weight and is kept)."""
    source = SecureRandom()
    noised = []
    for a in arrays:
        if not np.issubdtype(a.dtype, np.floating):
            noised.append(a)
            continue
        noise = source.normal(int(a.size), std).reshape(a.shape)
        noised.append((a.astype(np.float64) + noise).astype(a.dtype))
    return noised
