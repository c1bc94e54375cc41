"""FedAvg (McMahan et al., AISTATS 2017): the new global model is the clients' average.

``server.weighting: uniform`` averages clients equally (what the FedRCL authors do);
``samples`` weights each client by its number of training samples |D_i|.
"""

from strategies import STRATEGIES
from strategies.base import FederatedStrategy


class FedAvg(FederatedStrategy):
    name = "fedavg"
    defaults, rules = STRATEGIES.params(name)  # declared in strategies/__init__.py
