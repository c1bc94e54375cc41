"""Freeze baseline (as compared in UniVarFL; after FedBABU, Oh et al., ICLR 2022): the
classifier ``fc`` is randomly initialised once — from the experiment seed, so identically
for every client — and never updated; only the body is trained and aggregated.

The frozen classifier is excluded from the optimizer (no gradient step, no weight decay),
so it travels unchanged and the average of identical copies is the copy itself.
"""

from __future__ import annotations

from clients.base import FederatedClient


class FreezeClient(FederatedClient):
    method = "freeze"

    def trainable_parameters(self):
        frozen = {id(p) for p in self.model.fc.parameters()}
        return [p for p in self.model.parameters() if p.requires_grad and id(p) not in frozen]
