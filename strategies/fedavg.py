"""FedAvg (McMahan et al., AISTATS 2017): the new global model is the clients' average.

``server.weighting: uniform`` averages clients equally (what the FedRCL authors do);
``samples`` weights each client by its number of training samples |D_i|.
"""

from strategies.base import FederatedStrategy


class FedAvg(FederatedStrategy):
    name = "fedavg"
