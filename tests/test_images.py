"""Image folders and CSVs of path,label as a site's data: real PNG/JPEG files, Pillow, a real
DataLoader with a worker process; every refusal is one line naming the file (and CSV line)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from fedweave.errors import UserError
from fedweave.learning.images import (
    ImageFiles,
    ImageFolderTask,
    read_image_csv,
    read_image_folder,
    read_images,
    write_image_folder,
)
from fedweave.learning.tasks import load_task
from fedweave.learning.tasks.digit_folders import DigitFoldersTask

CLASSES = ("zebra", "ant")  # declared order, not sorted: the task's order gives the labels


def _save(path: Path, size=(12, 10), mode="RGB", fmt=None, seed=0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    image = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
    if mode not in ("RGB", "L"):
        image = image.convert(mode)
    image.save(path, format=fmt)
    return path


def _site(root: Path) -> Path:
    _save(root / "zebra" / "a.png")
    _save(root / "zebra" / "nested" / "b.jpg", size=(40, 30), fmt="JPEG")
    _save(root / "zebra" / "zèbre ü.png")
    _save(root / "ant" / "c.png", mode="RGBA")
    _save(root / "ant" / "d.png", mode="P")
    _save(root / "ant" / "e.bmp", mode="L")
    (root / "ant" / "notes.txt").write_text("not an example")
    _save(root / "ant" / ".hidden.png")
    return root


class Tiny(ImageFolderTask):
    name = "tiny"
    image_size = (8, 6)
    channels = 3
    classes = CLASSES


def _message(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_folder_of_class_folders_is_read_lazily_in_declared_order(tmp_path):
    data = read_image_folder(_site(tmp_path / "site"), (8, 6), 3, CLASSES)
    assert len(data) == 6  # .txt and hidden files are not examples
    assert data.labels.tolist() == [1, 1, 1, 0, 0, 0]  # ant = 1, zebra = 0, as declared
    names = ["c.png", "d.png", "e.bmp", "a.png", "b.jpg", "zèbre ü.png"]
    assert [Path(p).name for p in data.paths] == names
    for i in range(len(data)):
        x, y = data[i]
        assert x.shape == (3, 8, 6) and x.dtype == torch.float32 and y.dtype == torch.int64
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and y.ndim == 0
    gray = read_image_folder(tmp_path / "site", (5, 5), 1)  # classes from the sorted folders
    assert gray.classes == ("ant", "zebra") and gray[5][0].shape == (1, 5, 5)


def test_pixels_are_scaled_not_changed(tmp_path):
    pixels = np.arange(4 * 3, dtype=np.uint8).reshape(4, 3) * 20
    path = tmp_path / "site" / "zebra" / "x.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(pixels).save(path)
    x, _ = read_image_folder(tmp_path / "site", (4, 3), 1, CLASSES)[0]
    assert np.allclose(x[0].numpy(), pixels / 255.0)


def test_a_16_bit_image_is_scaled_by_its_depth_not_clipped(tmp_path):
    pixels = np.array([[0, 1000], [30000, 65535]], dtype=np.uint16)
    path = tmp_path / "site" / "ant" / "scan.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(pixels).save(path)
    data = read_image_folder(tmp_path / "site", (2, 2), 1, CLASSES)
    assert np.allclose(data[0][0][0].numpy(), pixels / 65535.0, atol=1e-6)
    rgb = read_image_folder(tmp_path / "site", (4, 4), 3, CLASSES)[-1][0]
    assert rgb.shape == (3, 4, 4) and torch.equal(rgb[0], rgb[2]) and float(rgb.max()) <= 1.0
    with pytest.raises(IndexError):
        data[1]


def test_a_csv_of_paths_and_labels(tmp_path):
    _site(tmp_path / "imgs")
    csv = tmp_path / "labels.csv"
    csv.write_text(
        "id,path,label\n1,imgs/zebra/a.png,zebra\n\n2,imgs/ant/c.png,ant\n3,imgs/ant/e.bmp,ant\n"
    )
    data = read_images(csv, (8, 6), 3, CLASSES)
    assert data.labels.tolist() == [0, 1, 1] and data[2][0].shape == (3, 8, 6)


def test_streams_through_a_dataloader_worker_and_trains(tmp_path):
    """The dataset crosses into a worker process (paths only) and a step learns from it."""
    task = Tiny()
    data = task.read_site_data(_site(tmp_path / "site"))
    assert isinstance(data, ImageFiles) and task.input_shape == (3, 8, 6)
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=2, shuffle=True, num_workers=1)
    seen = 0
    for xb, yb in loader:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(yb)
    assert seen == 6 and torch.isfinite(loss)


def test_the_example_task_is_a_task_and_reads_written_digits(tmp_path):
    task = load_task("fedweave.learning.tasks.digit_folders:DigitFoldersTask")
    assert isinstance(task, DigitFoldersTask)
    assert task.input_shape == (1, 28, 28) and task.num_classes == 10
    images = np.random.default_rng(0).random((6, 1, 28, 28)).astype(np.float32)
    write_image_folder(tmp_path / "site", images, np.array([0, 3, 3, 9, 0, 1]), task.classes)
    data = task.read_site_data(tmp_path / "site")
    assert sorted(data.labels.tolist()) == [0, 0, 1, 3, 3, 9]
    x, _ = data[0]
    assert np.abs(x.numpy() - images[0]).max() <= 0.5 / 255 + 1e-6
    assert task.build_model()(x[None]).shape == (1, 10)
    with pytest.raises(UserError, match="has no data of its own"):
        task.load_data()


def _refusal(tmp_path, build, path_of=lambda tmp: tmp / "site") -> str:
    build(tmp_path)
    with pytest.raises(UserError) as exc:
        read_images(path_of(tmp_path), (8, 6), 3, CLASSES)
    return _message(exc)


def test_a_folder_with_no_examples(tmp_path):
    def empty_class_folders(tmp):
        (tmp / "site" / "zebra").mkdir(parents=True)
        (tmp / "site" / "zebra" / "readme.txt").write_text("x")

    message = _refusal(tmp_path, empty_class_folders)
    assert message.startswith(f"{tmp_path / 'site'}: no images found")
    assert "one sub-folder per class (zebra, ant)" in message


def test_a_class_folder_the_task_does_not_declare(tmp_path):
    message = _refusal(tmp_path, lambda tmp: _save(tmp / "site" / "zebr" / "a.png"))
    assert message.startswith(f"{tmp_path / 'site' / 'zebr'}: folder 'zebr' is not one of")
    assert "(zebra, ant); rename or remove it" in message


def test_an_image_outside_any_class_folder(tmp_path):
    def loose(tmp):
        _save(tmp / "site" / "zebra" / "a.png")
        _save(tmp / "site" / "b.png")

    message = _refusal(tmp_path, loose)
    assert message.startswith(f"{tmp_path / 'site' / 'b.png'}: an image directly in")
    assert message.endswith("move it into the sub-folder of its class")


def test_a_file_that_is_not_an_image_is_refused_before_training(tmp_path):
    def fake(tmp):
        _save(tmp / "site" / "zebra" / "a.png")
        (tmp / "site" / "ant" / "b.png").parent.mkdir(parents=True)
        (tmp / "site" / "ant" / "b.png").write_bytes(b"these are not pixels")

    message = _refusal(tmp_path, fake)
    assert message == (
        f"{tmp_path / 'site' / 'ant' / 'b.png'}: not an image Pillow can read; "
        "remove or replace the file"
    )


def test_damaged_pixel_data_is_refused_at_first_read_with_its_path(tmp_path):
    """The header is sound, so the up-front check passes; decoding names the file."""
    path = _save(tmp_path / "site" / "zebra" / "a.png", size=(64, 64))
    path.write_bytes(path.read_bytes()[:200])
    data = read_images(tmp_path / "site", (8, 6), 3, CLASSES)
    with pytest.raises(UserError) as exc:
        data[0]
    assert _message(exc).startswith(f"{path}: image does not decode (")
    with pytest.raises(UserError) as exc:  # from a worker process: still the one line
        next(iter(DataLoader(data, batch_size=1, num_workers=1)))
    assert _message(exc).startswith(f"{path}: image does not decode (")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty CSV; it needs a header 'path,label'"),
        ("path,label\n\n", "empty CSV (a header and no rows)"),
        ("file,label\na.png,ant\n", "no column 'path' in the header (file, label)"),
        ("path,label\nimgs/zebra/a.png,zebra\nimgs/ant/c.png,bee\n",
         "line 3: label 'bee' is not one of the task's classes (zebra, ant)"),
        ("path,label\nimgs/zebra/a.png,zebra\n\nimgs/ant/gone.png,ant\n",
         "line 4: image file 'imgs/ant/gone.png' not found"),
        ("path,label\nimgs/zebra/a.png,zebra,extra\n", "line 2: 3 values but the header has 2"),
    ],
)  # fmt: skip
def test_csv_refusals_name_the_file_and_line(tmp_path, text, expected):
    _site(tmp_path / "imgs")
    csv = tmp_path / "labels.csv"
    csv.write_text(text)
    with pytest.raises(UserError) as exc:
        read_image_csv(csv, (8, 6), 3, CLASSES)
    message = _message(exc)
    assert message.startswith(str(csv)) and expected in message


def test_a_path_that_is_neither_folder_nor_csv(tmp_path):
    with pytest.raises(UserError, match="does not exist; pass --data with a folder"):
        read_images(tmp_path / "nowhere", (8, 6), 3, CLASSES)
    (tmp_path / "site.npz").write_bytes(b"x")
    with pytest.raises(UserError, match="one sub-folder per class or a .csv"):
        read_images(tmp_path / "site.npz", (8, 6), 3, CLASSES)
