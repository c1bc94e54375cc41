"""The low Flower edge, below the clients and the strategies: how weights travel in
Flower's messages and by reference (``transport``), and the one door to Flower's
non-public API (``flower_private``). Nothing here imports the adapters above it
(``fedrcl_flwr.app``'s ServerApp and ClientApp)."""
