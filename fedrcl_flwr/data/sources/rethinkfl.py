"""RethinkFL's domain-skew splits (WenkeHuang/RethinkFL @ 74201b3, FPL, CVPR 2023; the
protocol FedCCL's Digits / Office-Caltech experiments inherit), draw for draw.

Their trainer seeds NumPy's legacy global generator with the run's seed
(``utils/conf.py: set_random_seed``) and makes no other NumPy draw before the split
(the backbones are built with torch's generator; ``FederatedModel.random_state`` is a
fresh, unseeded ``RandomState``). Then, in this order:

1. ``utils/training.py: train`` picks each client's domain (``rand_dataset``, always on:
   argparse's ``type=bool`` reads any value as true): ``fl_digits``:
   ``np.random.choice(DOMAINS_LIST, size=parti_num, replace=True)``; ``fl_officecaltech``:
   the same with ``size=parti_num - len(DOMAINS_LIST)``, then ``DOMAINS_LIST`` appended
   (every domain at least once). Redrawn while a domain has more than 10 clients.
2. ``datasets/utils/federated_dataset.py``, client by client in that order:
   ``idxs = np.random.permutation(not_used[domain])``, the client keeps
   ``idxs[:int(percent * len(domain's training set))]`` and the rest stay unused
   (``partition_digits_domain_skew_loaders``: ``percent`` 0.01 per Digits domain).
   Office-Caltech (``partition_office_domain_skew_loaders_new``, ``percent`` 0.2): a class
   of the domain missing from the client's draw is added (one random sample of that
   class, ``np.random.randint``, from the domain's whole training set, used or not) in
   place of a random sample of a random class the client holds at least twice (two more
   ``randint`` draws); the unused list keeps ``idxs``' order without the client's samples.

Office-Caltech's train / test split is not random: ``datasets/officecaltech.py``
``ImageFolder_Custom`` numbers each domain's images in ``ImageFolder`` order (classes
sorted, files sorted) and keeps ``i % 10 <= 7`` for training, the rest for testing
(:func:`rethinkfl_train_mask`, ``dataset.test_split: rethinkfl``).

Here the domains are the dataset's domain ids ``0 .. D-1`` in ``dataset.domains`` order,
which plays their ``DOMAINS_LIST`` (``[mnist, usps, svhn, syn]``;
``[caltech, amazon, webcam, dslr]``): list them in that order to get their split. Each
client's indices are returned sorted (their ``SubsetRandomSampler`` reorders every epoch).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

# their percent_dict (every domain the same) and the cap in utils/training.py
DEFAULT_FRACTION = {"rethinkfl_digits": 0.01, "rethinkfl_office": 0.2}
MAX_CLIENTS_PER_DOMAIN = 10


def rethinkfl_train_mask(n: int) -> np.ndarray:
    """``True`` for the training images of one Office-Caltech domain of ``n`` images in
    ``ImageFolder`` order (their ``i % subset_capacity <= subset_train_num``, 10 and 7)."""
    return np.arange(n) % 10 <= 7


def _fractions(fraction, num_domains: int, generator: str) -> list[float]:
    if fraction is None:
        return [DEFAULT_FRACTION[generator]] * num_domains
    if isinstance(fraction, (int, float)):
        return [float(fraction)] * num_domains
    fr = [float(f) for f in fraction]
    if len(fr) != num_domains:
        raise ValueError(
            f"partition.domain_fraction lists {len(fr)} values for {num_domains} domains"
        )
    return fr


def pick_domains(rs: np.random.RandomState, num_domains: int, num_clients: int, office: bool):
    """Step 1: each client's domain id (their ``selected_domain_list``)."""
    dom = np.arange(num_domains)
    while True:
        if office:
            sel = list(rs.choice(dom, size=num_clients - num_domains, replace=True)) + list(dom)
        else:
            sel = list(rs.choice(dom, size=num_clients, replace=True))
        if max(Counter(sel).values()) <= MAX_CLIENTS_PER_DOMAIN:
            return [int(d) for d in sel]


def _fix_missing_classes(rs, selected: np.ndarray, train_labels: np.ndarray) -> np.ndarray:
    """Office-Caltech's swap: every class of the domain at least once (see the module
    docstring); ``selected`` and ``train_labels`` in the domain's own numbering."""
    count = np.zeros(len(np.unique(train_labels)))
    for lab in train_labels[selected]:
        count[lab] += 1
    for missing in np.flatnonzero(count == 0):
        of_class = np.flatnonzero(train_labels == missing)
        add = of_class[rs.randint(len(of_class))]
        current = train_labels[selected]
        donors = np.flatnonzero(count >= 2)
        if len(donors) == 0:  # their np.random.randint(0) fails here too
            raise ValueError(
                f"a client draws {len(selected)} samples, too few for the "
                f"{len(count)} classes their class swap gives every client: "
                "raise partition.domain_fraction"
            )
        donor = donors[rs.randint(len(donors))]
        where = np.flatnonzero(current == donor)
        drop = selected[where[rs.randint(len(where))]]
        selected = np.append(selected[selected != drop], add)
        count[donor] -= 1
        count[missing] += 1
    return selected


def rethinkfl_domain_split(
    labels: np.ndarray,
    domains: np.ndarray,
    num_clients: int,
    seed: int,
    generator: str,
    fraction=None,
) -> list[np.ndarray]:
    """Their clients' training indices (global positions in the training set), client
    ``i`` the ``i``-th loader their trainer builds. ``generator``: ``rethinkfl_digits`` |
    ``rethinkfl_office``; ``fraction``: their ``percent`` (a number, or one per domain)."""
    office = generator == "rethinkfl_office"
    labels, domains = np.asarray(labels), np.asarray(domains)
    num_domains = int(domains.max()) + 1
    if office and num_clients < num_domains:
        raise ValueError(
            f"rethinkfl_office gives every domain a client: num_clients {num_clients} "
            f"< {num_domains} domains"
        )
    if num_clients > MAX_CLIENTS_PER_DOMAIN * num_domains:
        raise ValueError(
            f"{num_clients} clients: their trainer allows at most "
            f"{MAX_CLIENTS_PER_DOMAIN} per domain ({num_domains} domains)"
        )
    fr = _fractions(fraction, num_domains, generator)
    pos = [np.flatnonzero(domains == d) for d in range(num_domains)]
    rs = np.random.RandomState(seed)
    sel = pick_domains(rs, num_domains, num_clients, office)
    unused = {d: np.arange(len(pos[d])) for d in range(num_domains)}
    out: list[np.ndarray] = []
    for d in sel:
        idxs = rs.permutation(unused[d])
        take = int(fr[d] * len(pos[d]))
        chosen = idxs[:take]
        if office:
            chosen = _fix_missing_classes(rs, chosen, labels[pos[d]])
            unused[d] = idxs[~np.isin(idxs, chosen)]
        else:
            unused[d] = idxs[take:]
        if len(chosen) == 0:
            raise ValueError(
                f"client {len(out)} gets no sample: domain {d} has {len(pos[d])} training "
                f"samples x domain_fraction {fr[d]} < 1"
            )
        out.append(np.sort(pos[d][chosen]).astype(np.int64))
    return out
