"""Flower adapters: the ServerApp and ClientApp (the only Flower code in ``fedrcl_flwr``)."""
