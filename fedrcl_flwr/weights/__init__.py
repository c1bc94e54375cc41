"""Model weights by reference inside one node: a store of immutable files, one per blob,
each named by its content hash (no Flower here; the translation to and from Flower's
messages is ``fedrcl_flwr/app/wire/transport.py``).

In a simulation Flower's messages carry the whole model (serialised, copied into the
SuperLink's object store, handed to a Ray actor, and the same way back). With
``simulation.transport: shared`` the server writes the round's weights once into this
store and the message carries a small JSON *reference* (the store, the hash, the layout:
dtypes, shapes, offsets); a client maps the file read-only with ``mmap``, checks the
layout, and copies the arrays into its model while it hashes them. Uploads come back the
same way and the strategy averages them from where they lie, hashing each piece it
averages.

* **Where**: a directory of the run's own (``lifecycle.create_store``), made by
  ``mkdtemp`` (an unpredictable name, created exclusively, mode 0700) under ``/dev/shm``
  (memory, visible to every process of the node) or, where ``/dev/shm`` is unusable,
  inside the run's private home; it is marked (``lifecycle.STORE_MARKER``: the PIDs of
  the processes that own it), and only a marked directory is ever removed: by the run's
  teardown (``lifecycle.remove_store``, also after a ``kill -9`` of the CLI) or, once
  every PID it names is gone, by a later run (``lifecycle.remove_stale_stores``).
* **Names**: the hex digest of XXH3-128 (``xxhash``) or, without it, SHA-256 of the
  whole file (header included). A reader copies the entry out of the store and hashes
  what it copied, in one pass (``reading.read_entry``; the server's average:
  ``reading.HashCheck``), on every read, so that the bytes it uses are the bytes that
  hashed to the name: a damaged, truncated, rewritten or foreign entry is refused
  (``entries.StoreError``), and so is anything in the store that is not a regular file
  (a FIFO, a device, a link: opened with ``O_NOFOLLOW | O_NONBLOCK``, checked with
  ``fstat``, never waited on).
* **Publishing** (``store.WeightStore.publish``): the hash first (one read of the
  arrays), then, unless this process already wrote that entry, the file as a temporary
  name and one ``rename`` (atomic; no fsync: the file lives in memory and dies with the
  run).

File layout: ``MAGIC`` (8 bytes), the header's length (8 bytes, little-endian), the
header (JSON: the list of arrays as ``[dtype, shape, offset, nbytes]``), then each
array's C-order bytes at its offset (64-byte aligned).

**Slots** (``store.Arena``): a file per entry costs, on every round, the kernel's page
allocation when it is written and a page fault per 4 KiB page in each process that maps
it (tmpfs; ~24 ms and ~9 ms per 42 MiB entry on a quiet 2-core machine, several times
that under load). So the server also creates, once, one preallocated file ``arena`` in
the store, cut into equal slots (the entry's size rounded up to a page): a ring of
``entries.GLOBAL_SLOTS`` for the models it sends and two sets of one slot per client of
a round for the uploads (round parity). Every process maps the arena once and keeps the
mapping (a writer also a writable one); a writer copies an entry into a slot, whose
pages already exist, and hashes each piece right after copying it. An entry in a slot
has the same layout and the same hash check as a file (its reference adds ``offset``),
but a slot is reused: a global model's slot two rounds later (after ``GLOBAL_SLOTS``
more sends), an upload's slot two rounds later. A reader that reads a slot after that is
refused by the hash (a client more than a round late); what it copied and checked in
time is what it trains on. The server checks a slot it would send again (the same model)
before it does (``reading.intact``) and writes the model afresh when the slot no longer
holds it.

The package's modules: ``entries`` (an entry's on-disk format, its hash and reference,
the checks of a reference and of a file), ``reading`` (copying an entry out while
hashing it), ``mappings`` (this process's kept mappings of arenas), ``store``
(publishing: the store and its arena of slots) and ``lifecycle`` (a run's store:
creation, owner record, removal).
"""
