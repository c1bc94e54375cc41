"""The Flower-free server pieces: aggregation arithmetic (``aggregation``) and the signal
exchange of FedCCL / FedProto / FPL (``signal_exchange``). The Flower ``Strategy`` classes in
``strategies/`` import these."""
