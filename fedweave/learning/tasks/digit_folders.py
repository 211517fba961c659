"""``digit-folders``: the image-folder task to copy for your own images.

Each site's ``--data`` is a folder with one sub-folder per digit (``0/`` ... ``9/``) of
grayscale images of any size (resized to 28x28), or a CSV of ``path,label``. To try it on
data in hand, write ``mnist5k``'s images as such a folder::

    from pathlib import Path
    from fedweave.learning.images import write_image_folder
    from fedweave.learning.tasks.mnist5k import Mnist5kTask

    train, _ = Mnist5kTask().load_data()  # ordered by class: take every other image
    for i, site in enumerate(["site-a", "site-b"]):
        part = slice(i, None, 2)
        write_image_folder(Path(site), train.x[part], train.y[part], DigitFoldersTask.classes)

For your own: copy this class into your module, set the four attributes, and pass
``--task my_module:MyTask``; override ``build_model`` for another model.
"""

from __future__ import annotations

from fedweave.learning.images import ImageFolderTask


class DigitFoldersTask(ImageFolderTask):
    """Handwritten digits from a site's own image files, the default small CNN."""

    name = "digit-folders"
    image_size = (28, 28)
    channels = 1
    classes = tuple("0123456789")
