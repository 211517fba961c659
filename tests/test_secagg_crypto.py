"""fedweave's SecAgg+ Shamir sharing and key pairs against Flower's and PyCryptodome's own."""

import os
import random

import pytest
from Crypto.Protocol.SecretSharing import _Element
from flwr.common.secure_aggregation.crypto import shamir as flower_shamir
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fedweave.flower_patches import secagg_crypto


def _random_element() -> int:
    return int.from_bytes(os.urandom(16), "big")


def test_field_arithmetic_matches_pycryptodome():
    rng = random.Random(0)
    for _ in range(200):
        a = _random_element()
        b = rng.choice([_random_element(), rng.randint(1, 300)])
        assert secagg_crypto.gf_mul(a, b) == int(_Element(a) * _Element(b))
        assert secagg_crypto.gf_inverse(a) == int(_Element(a).inverse())
        assert secagg_crypto.gf_mul(a, secagg_crypto.gf_inverse(a)) == 1
    with pytest.raises(ValueError):
        secagg_crypto.gf_inverse(0)


@pytest.mark.parametrize("num, threshold", [(3, 2), (5, 3), (21, 11), (45, 23)])
@pytest.mark.parametrize("length", [16, 32, 45, 241])  # seeds, odd sizes, a P-256 PEM key
def test_shares_interoperate_with_flowers_both_ways(num, threshold, length):
    rng = random.Random(num * 1000 + length)
    secret = os.urandom(length)
    ours = secagg_crypto.create_shares(secret, threshold, num)
    theirs = flower_shamir.create_shares(secret, threshold, num)
    assert len(ours) == num and {len(s) for s in ours} == {len(theirs[0])}
    assert [s[:4] for s in ours] == [s[:4] for s in theirs]  # same indices, same layout
    for shares in (ours, theirs):
        subset = rng.sample(shares, threshold)
        assert secagg_crypto.combine_shares(subset) == secret
        assert flower_shamir.combine_shares(subset) == secret
        assert secagg_crypto.combine_shares(rng.sample(shares, num)) == secret  # all, any order


def test_fewer_shares_than_the_threshold_do_not_reveal_the_secret():
    secret = os.urandom(32)
    shares = secagg_crypto.create_shares(secret, 6, 11)
    for _ in range(5):
        try:
            assert secagg_crypto.combine_shares(random.sample(shares, 5)) != secret
        except ValueError:
            pass  # the interpolated chunk is not even validly padded


def test_two_splits_of_one_secret_differ():
    secret = os.urandom(32)
    assert secagg_crypto.create_shares(secret, 3, 5) != secagg_crypto.create_shares(secret, 3, 5)


def test_bad_share_lists_are_refused():
    shares = secagg_crypto.create_shares(os.urandom(32), 2, 3)
    with pytest.raises(ValueError, match="Duplicate"):
        secagg_crypto.combine_shares([shares[0], shares[0]])
    with pytest.raises(ValueError):
        secagg_crypto.combine_shares([shares[0], shares[1][:-16]])
    with pytest.raises(ValueError):
        secagg_crypto.combine_shares([])
    with pytest.raises(ValueError):
        secagg_crypto.create_shares(b"x", 4, 3)


def test_site_keys_are_p256_and_agree_through_flowers_pem_and_ecdh():
    sk_a, pk_a = secagg_crypto.generate_key_pairs()
    sk_b, pk_b = secagg_crypto.generate_key_pairs()
    assert sk_a.curve.name == "secp256r1"
    # the way Flower's mod stores them and the coordinator rebuilds a dropped site's key
    sk_a2 = bytes_to_private_key(private_key_to_bytes(sk_a))
    pk_b2 = bytes_to_public_key(public_key_to_bytes(pk_b))
    assert generate_shared_key(sk_a2, pk_b2) == generate_shared_key(sk_b, pk_a)


def test_installed_into_flowers_secagg_modules():
    import importlib

    from fedweave.flower_patches import use_fedweave_secagg

    use_fedweave_secagg()
    # the packages re-export functions under the modules' names: import the modules themselves
    mod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    workflow = importlib.import_module(
        "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
    )
    assert mod.create_shares is secagg_crypto.create_shares
    assert mod.generate_key_pairs is secagg_crypto.generate_key_pairs
    assert workflow.combine_shares is secagg_crypto.combine_shares
    key = private_key_to_bytes(secagg_crypto.generate_key_pairs()[0])
    assert mod.bytes_to_private_key(key) is mod.bytes_to_private_key(key)  # loaded once
