"""FedAvg client (McMahan et al., AISTATS 2017): plain cross-entropy local SGD.

Its whole objective is the default of :class:`clients.base.FederatedClient`.
"""

from clients.base import FederatedClient


class FedAvgClient(FederatedClient):
    method = "fedavg"
