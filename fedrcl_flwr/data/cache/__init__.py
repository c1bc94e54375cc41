"""The dataset cache: a dataset's prepared arrays, built once, memory-mapped by every process.

Preparing a dataset — generating the synthetic images, decoding torchvision's files,
resizing image folders, holding out the validation split — takes seconds, and every
process of a run (the CLI's checks, the ServerApp, each Ray worker or SuperNode) used to
do it again and hold its own copy of the pixels. Now the first process that needs a
dataset writes its arrays to an *entry* of the cache directory and every process
memory-maps that entry read-only: the pixels exist once in the page cache, whatever the
number of workers.

Where: ``dataset.cache_dir``; if null, ``$FEDRCL_FLWR_CACHE_DIR``, else
``$XDG_CACHE_HOME/fedrcl-flwr``, else ``~/.cache/fedrcl-flwr``.

Key: an entry is named by the SHA-256 of everything that determines the arrays — the
dataset settings that shape them (name, resolved ``root`` / ``path``, ``image_size``,
``normalize`` (true, false or the constants themselves: the stored statistics),
``val_fraction``, ``domains``, ``test_fraction``, the synthetic generator's settings, and
the seed where it draws something: the synthetic images, the validation hold-out, an image
folder's test split) plus the size and modification time of every source file read — and
the cache format. Augmentation (``augment``, ``rotation``, ``crop_pad``, ``flip``,
``pad_fill``) is drawn per batch and is not part of it.

An entry is a directory ``<key>/`` of ``.npy`` arrays (images already in the (N, C, H, W)
layout training uses; labels; domain ids) plus ``meta.json`` (shapes, dtypes, byte sizes and
SHA-256 of every array file; normalisation statistics; number of classes; domain names) and
``meta.sha256`` (the hash of ``meta.json``). Written atomically: built in a temporary
directory beside it, flushed to disk, then renamed into place; when two processes race, the
first rename wins and the other uses the winner's entry. Opening checks the metadata's hash
and fields, every array's size and header; :func:`~fedrcl_flwr.data.cache.store.load` (what
the CLI runs once before a run starts) also checks every array file's content hash, so an
entry edited in place (same sizes) is rebuilt with a note, never used; the processes of the
run trust that check and only open the entry
(:func:`~fedrcl_flwr.data.cache.entries.open_prepared`).

Only what is provably the cache's own is ever removed
(:func:`~fedrcl_flwr.data.cache.ownership.is_own_entry`): a directory named by a key (32 hex
digits) or a temporary ``.tmp-<key>-*`` / ``.discard-<key>-*`` directory, holding only the
cache's file names with the cache's content (its metadata hash line and fields, NumPy's
magic in every array file). Anything else in the cache directory is listed as ``foreign`` by
``cache ls`` and left alone by ``cache clear``.

Simulations run by ``fedrcl-flwr run`` prepare the entry in the CLI before any Flower
process exists and hand its path to the ServerApp and the ClientApps
(:func:`fedrcl_flwr.run.runtime.use_prepared_dataset`), which then only open it. On a Ray
cluster across machines the cache directory must therefore be a path every node sees
(a shared filesystem); a node without it stops with one error naming the host and the path.

The package: :mod:`~fedrcl_flwr.data.cache.layout` (the entry format, where the cache is),
:mod:`~fedrcl_flwr.data.cache.ownership` (what is the cache's own, removing it),
:mod:`~fedrcl_flwr.data.cache.keys` (the key), :mod:`~fedrcl_flwr.data.cache.entries`
(reading an entry), :mod:`~fedrcl_flwr.data.cache.store` (writing one, and the load that
builds on a miss), :mod:`~fedrcl_flwr.data.cache.splits` (the stored client splits) and
:mod:`~fedrcl_flwr.data.cache.manage` (``cache ls`` / ``cache clear``)."""
