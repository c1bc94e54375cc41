"""The raw readers of the datasets, one module per format, and the table that names them.

Each reader returns the training and test images of one source as ``uint8`` arrays
(N, H, W, C) in :class:`~fedrcl_flwr.data.sources.raw.RawSplit`s:

* :mod:`.raw`: that form (:class:`~.raw.RawSplit`, :class:`~.raw.DatasetError`) and the
  checks that bring an array to it;
* :mod:`.torchvision_files`: the files torchvision's classes read (CIFAR-10/100, STL-10,
  SVHN, USPS, MNIST / Fashion-MNIST idx files), decoded by those classes;
* :mod:`.imagefolder`: image-folder trees (PACS, Office-10, DomainNet, HAM10000,
  RethinkFL's trees) and Tiny-ImageNet as distributed;
* :mod:`.npz`: the user's ``.npz`` arrays;
* :mod:`.digit5`: Digit-5 (MNIST, SVHN, USPS, SynthDigits, MNIST-M at 32x32 RGB);
* :mod:`.synthetic`: the embedded synthetic images, generated;
* :mod:`.hf`: datasets saved with Hugging Face's ``save_to_disk``, and Flower Datasets'
  partitioners run on our labels;
* :mod:`.rethinkfl`: RethinkFL's train / test rule for image folders and its domain-skew
  splits;
* :mod:`.memory`: the memory check every reader runs before it allocates;
* :mod:`.table`: :data:`~.table.SOURCES`, every dataset of the catalog once, by name (its
  reader, standard augmentation, torchvision layout, cache-key fields).

This package imports nothing else of :mod:`fedrcl_flwr.data`; the loader
(:mod:`fedrcl_flwr.data.datasets`), the splits (:mod:`fedrcl_flwr.data.partition`, which
also draws the splits of :mod:`.hf` and :mod:`.rethinkfl`) and the dataset cache
(:mod:`fedrcl_flwr.data.cache`) build on it.
"""
