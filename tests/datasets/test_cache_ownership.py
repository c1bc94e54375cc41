"""``cache clear`` removes only what it proves the cache's own by content (the metadata's
hash line and fields, NumPy's magic in the array files), never by name alone; an entry's
path holding a link is one line, not an internal error. Through the CLI's ``main``."""

from __future__ import annotations

import json

import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.cache import store


@pytest.fixture
def entry(tiny, tmp_path):
    c = tiny(dataset={"synthetic": {"num_train": 64, "num_test": 16, "image_size": 8}})
    c.dataset.cache_dir = str(tmp_path / "cache")
    return c, store.load(c.dataset, c.seed)[1]


def _clear(capsys, root):
    rc = main(["cache", "clear", "--cache-dir", str(root)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_user_data_under_cache_names_is_left_alone(entry, capsys):
    _, own = entry
    root = own.parent
    mine = root / ("ab" * 16)  # a 32-hex name holding the user's own meta.json
    mine.mkdir()
    (mine / "meta.json").write_text(json.dumps({"experiment": "mine", "notes": "keep"}))
    tmp = root / f".tmp-{'cd' * 16}-x1"  # the cache's temporary name, user data inside
    tmp.mkdir()
    (tmp / "train_x.npy").write_bytes(b"my own bytes, not an array")
    fake = root / ("ef" * 16)  # the cache's file names, a user's hash file of its own
    fake.mkdir()
    (fake / "meta.json").write_text("{}")
    (fake / "meta.sha256").write_text("not a hash\n")
    rc, out, err = _clear(capsys, root)
    assert rc == 0 and not err
    assert "removed 1 entry" in out and "left 3 item(s)" in out, out
    assert not own.exists()
    assert json.loads((mine / "meta.json").read_text())["notes"] == "keep"
    assert (tmp / "train_x.npy").read_bytes() == b"my own bytes, not an array"
    assert (fake / "meta.sha256").exists()


def test_cache_own_leftovers_are_still_cleared(entry, capsys):
    """A killed build (a temporary entry with arrays, no metadata yet) and an entry whose
    hash line was damaged are the cache's by content: cleared."""
    _, own = entry
    root = own.parent
    tmp = root / f".tmp-{own.name}-k1"
    tmp.mkdir()
    (tmp / "train_x.npy").write_bytes((own / "train_x.npy").read_bytes()[:200])
    (own / "meta.sha256").write_text("0\n")  # meta.json still carries the cache's fields
    rc, out, _ = _clear(capsys, root)
    assert rc == 0 and "removed 1 entry" in out and "not dataset cache entries" not in out, out
    assert list(root.iterdir()) == []


def test_a_linked_file_in_an_entry_is_one_line(entry, tmp_path, capsys):
    c, own = entry
    outside = tmp_path / "outside.npy"
    outside.write_bytes((own / "test_y.npy").read_bytes())
    (own / "test_y.npy").unlink()
    (own / "test_y.npy").symlink_to(outside)
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "dataset": {
                    "cache_dir": c.dataset.cache_dir,
                    "synthetic": {"num_train": 64, "num_test": 16, "image_size": 8},
                },
                **{k: v for k, v in TINY.items()},
            }
        )
    )
    for argv in (["partition", str(exp)], ["cache", "clear", "--cache-dir", str(own.parent)]):
        rc = main(argv)
        out, err = capsys.readouterr()
        if argv[0] == "partition":
            assert rc == 2 and len(err.strip().splitlines()) == 1, err
            assert "internal error" not in err and "not a dataset cache entry" in err, err
            assert str(exp) in err
        else:
            assert rc == 0 and "left 1 item(s)" in out, out
    assert (own / "test_y.npy").is_symlink() and outside.read_bytes()


TINY = {
    "partition": {"scheme": "iid"},
    "federation": {"num_clients": 4, "rounds": 1, "participation": None, "clients_per_round": 2},
    "client": {"device": "cpu"},
}
