"""The split-file format of ``partition.scheme: file``: JSON ``{"<client>": [indices]}`` as
``fedrcl-flwr partition --save`` writes it (:func:`save_split_file`), or the FedRCL /
FedACG authors' released text format, a Python dict literal ``{0: [10385, ...], ...}`` or
``{0: {16406, ...}}`` (``client_data/<DATASET>/balanced/*.txt`` in skynbe/FedRCL @
378beb4), read as data by a bounded scanner (:func:`_parse_dict_literal`; nothing is
evaluated). Every file is size-bounded before it is parsed and checked as a whole
(:func:`load_split_file`); any problem is one :class:`~fedrcl_flwr.errors.PartitionError`
naming the file.

The scanner is kept rather than ``ast.literal_eval``: Python's parser keeps the last of
two equal keys silently (a client's list would be lost), refuses integers with leading
zeros that the scanner reads, and builds a Python object per number (``ast.parse`` of
the authors' format for ImageNet's 1,281,167 training indices peaks at 1.3 GiB).
"""

from __future__ import annotations

import numpy as np

from fedrcl_flwr.errors import PartitionError

# A split file lists every training index at most once: a few bytes per index. Bound
# what is read (before parsing) so that a wrong or hostile file is refused at once.
SPLIT_BYTES_PER_INDEX = 32
SPLIT_BYTES_BASE = 1 << 20

_LITERAL_ITEM = None  # compiled on first use (see _parse_dict_literal)


def _no_duplicate_keys(where: str):
    def hook(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise PartitionError(
                    f"{where}: client {k!r} appears twice (a key given "
                    "twice in one mapping; the first list would be lost)"
                )
            seen.add(k)
        return dict(pairs)

    return hook


def _parse_dict_literal(text: str, where: str):
    """The FedRCL authors' text format ``{0: [10385, ...], 1: [...], ...}`` (a Python
    dict literal of integer keys and integer lists, tuples or sets), parsed as data by a
    bounded scanner — nothing is evaluated, nesting is fixed at two levels, and a key
    given twice is an error. ``None`` when ``text`` is not of that form."""
    import re

    global _LITERAL_ITEM
    if _LITERAL_ITEM is None:
        _LITERAL_ITEM = re.compile(
            r"\s*(-?\d+)\s*:\s*(?:\[([-\d,\s]*)\]|\(([-\d,\s]*)\)|\{([-\d,\s]*)\})"
            r"\s*(,|\})"
        )
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    out: dict[int, list] = {}
    pos, end = 1, len(body)
    if not body[1:-1].strip():
        return out
    while pos < end:
        m = _LITERAL_ITEM.match(body, pos)
        if m is None:
            return None
        key = int(m.group(1))
        items = next(g for g in m.group(2, 3, 4) if g is not None)
        vals = [t.strip() for t in items.split(",")]
        if vals and vals[-1] == "":
            vals.pop()  # a trailing comma
        if any(not re.fullmatch(r"-?\d+", v) for v in vals):
            return None
        if key in out:
            raise PartitionError(
                f"{where}: client {key} appears twice (a key given twice "
                "in one mapping; the first list would be lost)"
            )
        ints = [int(v) for v in vals]
        if m.group(4) is not None:  # a set (the authors' iid files): Python's set order,
            as_set = set(ints)  # as their trainer and ast.literal_eval build it
            if len(as_set) != len(ints):
                raise PartitionError(f"{where}: client {key}: an index is given twice")
            ints = list(as_set)
        out[key] = ints
        pos = m.end()
        if m.group(5) == "}":
            return out if pos == end else None
    return None


def load_split_file(path: str, n: int, num_clients: int) -> list[np.ndarray]:
    """Client index lists from a split file, checked: ``num_clients`` clients with ids
    ``0 .. num_clients-1`` (JSON string keys or integer keys), each given once, integer
    indices (a list, or a set as in the authors' iid files, taken in Python's set order as
    their trainer does) in ``[0, n)``, no index given twice. The file must be UTF-8 text
    of at most ``1 MiB + 32 bytes x n`` (read before parsing). JSON is tried first, then
    the authors' Python dict literal, read by a bounded scanner
    (:func:`_parse_dict_literal`: data only, nothing is executed). Any problem is one
    :class:`PartitionError` naming the file."""
    from pathlib import Path

    p = Path(path).expanduser()
    where = f"partition.path {str(p)!r}"
    data = _read_split_mapping(p, where, n)
    out = _client_index_lists(data, where, n, num_clients)
    allidx = np.concatenate(out)
    uniq, counts = np.unique(allidx, return_counts=True)
    if len(uniq) != len(allidx):
        dup = int(uniq[counts > 1][0])
        owners = [c for c, a in enumerate(out) if dup in a]
        raise PartitionError(
            f"{where}: index {dup} is given more than once "
            f"(clients {owners}); client splits must be disjoint"
        )
    return out


def _read_split_mapping(p, where: str, n: int) -> dict:
    """The split file's mapping (JSON, else the authors' dict literal), read within its
    size bound (:func:`load_split_file`)."""
    import json

    from fedrcl_flwr.config import read_text_file

    limit = SPLIT_BYTES_BASE + SPLIT_BYTES_PER_INDEX * int(n)
    if not p.exists():
        raise PartitionError(f"{where}: cannot read the split file (no such file)")
    text = read_text_file(
        p, limit, f"a split of {n} training samples", label=where, error=PartitionError
    )
    if "\0" in text:
        raise PartitionError(
            f"{where}: binary content (NUL bytes); a split file is JSON or "
            "the authors' dict-literal text"
        )
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys(where))
    except RecursionError:
        raise PartitionError(
            f"{where}: nested too deeply (a split file is one mapping of index lists)"
        ) from None
    except ValueError as exc:
        if isinstance(exc, PartitionError):
            raise
        data = _parse_dict_literal(text, where)
        if data is None:
            raise PartitionError(
                f"{where}: neither JSON nor a Python dict literal {{client: [indices], ...}}"
            ) from None
    if not isinstance(data, dict):
        raise PartitionError(
            f"{where}: must map client ids to index lists, got {type(data).__name__}"
        )
    return data


def _client_index_lists(data: dict, where: str, n: int, num_clients: int) -> list[np.ndarray]:
    """One ``int64`` index array per client ``0 .. num_clients-1`` from the file's mapping,
    each id given once, each list non-empty, every index in ``[0, n)``."""
    parts: dict[int, list] = {}
    for key, idx in data.items():
        try:
            cid = int(key)
        except (TypeError, ValueError):
            cid = None
        if cid is None or isinstance(key, bool) or str(cid) != str(key).strip():
            raise PartitionError(f"{where}: client id {str(key)[:40]!r} is not an integer")
        if cid in parts:
            raise PartitionError(f"{where}: client {cid} appears twice")
        if isinstance(idx, (set, frozenset)):  # the authors' iid files: {0: {16406, ...}}
            idx = list(idx)
        if not isinstance(idx, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in idx
        ):
            raise PartitionError(f"{where}: client {cid}: indices must be a list of integers")
        parts[cid] = list(idx)
    if sorted(parts) != list(range(num_clients)):
        raise PartitionError(
            f"{where}: holds {len(parts)} clients (ids {_span(parts)}) but "
            f"federation.num_clients is {num_clients} (ids 0..{num_clients - 1})"
        )
    out = []
    for c in range(num_clients):
        try:
            out.append(np.asarray(parts[c], dtype=np.int64))
        except OverflowError:
            raise PartitionError(
                f"{where}: client {c}: an index is out of range for {n} training samples"
            ) from None
    for c, a in enumerate(out):
        if len(a) == 0:
            raise PartitionError(f"{where}: client {c} has no samples")
        if a.min() < 0 or a.max() >= n:
            bad = int(a[(a < 0) | (a >= n)][0])
            raise PartitionError(
                f"{where}: client {c}: index {bad} out of range for {n} training samples"
            )
    return out


def _span(ids) -> str:
    ids = sorted(ids)
    return f"{ids[0]}..{ids[-1]}" if ids else "none"


def save_split_file(parts, path) -> None:
    """Write ``{"<client id>": [indices], ...}`` as JSON (read back by ``scheme: file``)."""
    import json
    from pathlib import Path

    data = {str(c): [int(i) for i in p] for c, p in enumerate(parts)}
    Path(path).expanduser().write_text(json.dumps(data) + "\n")
