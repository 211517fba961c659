"""``fedweave.client``: what runs a Flower site (ClientApp, site mods, ``fedweave client``)."""
