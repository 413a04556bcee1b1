"""Datasets: synthetic ones are seeded and learnable, CIFAR is read from real pickle files
(checked against the published md5 sums, unpickled with only the format's types), and bad
data folders fail with a message a person can act on.

The CIFAR files here are small ones tests/cifar_files.py writes, so their md5 sums are not
the published ones: tests that load them pass ``verify_checksums=False``, as a person with
a copy of their own passes ``--no-verify-checksums``."""

import hashlib
import os
import pickle
import shlex
import time

import numpy as np
import pytest
import torch

from hetero_ray.builtin.data import DataSplit, check_data_dir, download_dataset, load_dataset
from hetero_ray.builtin.models import build_model, compute_loss, eval_batch_stats
from hetero_ray.errors import ConfigError, UserError
from tests.cifar_files import read_batch, write_cifar10, write_cifar100, write_py2_pickle

CIFAR10_DIR = "cifar-10-batches-py"


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) for x, y in zip(a.batch(torch.arange(len(a))), b.batch(torch.arange(len(b))))
    )


# --- synthetic ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["synthetic_image", "synthetic_text"])
def test_synthetic_is_a_function_of_the_seed(name):
    first = load_dataset(name, num_samples=300, eval_samples=50, seed=3)
    again = load_dataset(name, num_samples=300, eval_samples=50, seed=3)
    other = load_dataset(name, num_samples=300, eval_samples=50, seed=4)
    assert _same(first.train, again.train) and _same(first.eval, again.eval)
    assert not torch.equal(first.train.batch([0, 1])[0], other.train.batch([0, 1])[0])
    assert not torch.equal(first.train.batch([0, 1])[0], first.eval.batch([0, 1])[0])


@pytest.mark.parametrize("name", ["synthetic_image", "synthetic_text"])
def test_synthetic_ignores_and_keeps_global_rng(name):
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = load_dataset(name, num_samples=64, eval_samples=8)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(123)
    assert _same(first.train, load_dataset(name, num_samples=64, eval_samples=8).train)


def test_synthetic_eval_does_not_depend_on_train_size():
    small = load_dataset("synthetic_image", num_samples=64, eval_samples=32)
    large = load_dataset("synthetic_image", num_samples=256, eval_samples=32)
    assert _same(small.eval, large.eval)


def test_synthetic_image_shapes():
    start = time.perf_counter()
    bundle = load_dataset("synthetic_image", num_samples=4096, eval_samples=512)
    print(f"\nsynthetic_image, 4096 + 512 samples: {time.perf_counter() - start:.2f} s")  # a figure, not a check
    assert (len(bundle.train), len(bundle.eval)) == (4096, 512)
    assert (bundle.spec.kind, bundle.spec.num_classes, bundle.spec.input_shape) == ("image", 10, (3, 32, 32))
    inputs, targets = bundle.train.batch(torch.tensor([5, 1, 5]))
    assert inputs.shape == (3, 3, 32, 32) and inputs.dtype == torch.float32
    assert targets.dtype == torch.int64 and torch.equal(inputs[0], inputs[2])
    assert set(bundle.train.batch(torch.arange(4096))[1].tolist()) == set(range(10))


def test_synthetic_image_is_learnable():
    bundle = load_dataset("synthetic_image", num_samples=1024, eval_samples=256)
    torch.manual_seed(0)
    model = build_model("mlp", bundle.spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        loss = compute_loss(*_forward(model, bundle.train, torch.randint(0, 1024, (64,), generator=generator)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        stats = eval_batch_stats(*_forward(model, bundle.eval, torch.arange(256)))
    assert stats["correct"] / stats["count"] > 0.3  # chance is 0.1


def _forward(model, split, indices):
    inputs, targets = split.batch(indices)
    return model(inputs), targets


def test_synthetic_text_targets_are_inputs_shifted():
    bundle = load_dataset("synthetic_text", num_samples=128, eval_samples=16)
    assert (bundle.spec.kind, bundle.spec.vocab_size, bundle.spec.seq_len) == ("text", 256, 64)
    inputs, targets = bundle.train.batch([0, 9])
    assert inputs.shape == targets.shape == (2, 64)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert 0 <= int(inputs.min()) and int(targets.max()) < 256


def test_synthetic_text_is_learnable_by_bigram_counts():
    # The chain gives each token 4 successors, the likeliest with probability 1/2: a bigram
    # table from the training set predicts held-out next tokens far above chance (1/256).
    bundle = load_dataset("synthetic_text", num_samples=1024, eval_samples=128)
    inputs, targets = bundle.train.batch(torch.arange(1024))
    counts = torch.zeros(256, 256).index_put_((inputs.flatten(), targets.flatten()), torch.ones(inputs.numel()), accumulate=True)
    eval_inputs, eval_targets = bundle.eval.batch(torch.arange(128))
    accuracy = (counts.argmax(1)[eval_inputs] == eval_targets).float().mean()
    assert 0.4 < accuracy < 0.6


def test_data_split_batch_accepts_lists_and_checks_lengths():
    split = DataSplit(torch.arange(10).view(5, 2), torch.arange(5))
    inputs, targets = split.batch([4, 0])
    assert torch.equal(inputs, torch.tensor([[8, 9], [0, 1]])) and torch.equal(targets, torch.tensor([4, 0]))
    with pytest.raises(ValueError, match="5 inputs but 4 targets"):
        DataSplit(torch.zeros(5, 2), torch.zeros(4))


def test_bad_names_and_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="--dataset must be one of"):
        load_dataset("mnist")
    with pytest.raises(ConfigError, match="--dataset must be one of"):
        check_data_dir("mnist", None)
    with pytest.raises(ConfigError, match="--num-samples must be a positive integer"):
        load_dataset("synthetic_image", num_samples=0)


def test_check_data_dir_ignores_synthetic_datasets():
    check_data_dir("synthetic_image", None)
    check_data_dir("synthetic_text", "/does/not/matter")


# --- CIFAR ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_cifar10(root, num_train=103, num_test=20, seed=1)
    write_cifar100(root, num_train=60, num_test=10, seed=2)
    return root


def test_helper_files_read_like_the_official_ones(cifar_root):
    as_bytes = read_batch(cifar_root / CIFAR10_DIR / "data_batch_1", encoding="bytes")
    assert set(as_bytes) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert as_bytes[b"data"].dtype == np.uint8 and as_bytes[b"data"].shape == (21, 3072)
    as_str = read_batch(cifar_root / "cifar-100-python" / "train")
    assert set(as_str) == {"batch_label", "fine_labels", "coarse_labels", "data", "filenames"}


def test_cifar10_loads_from_the_batches(cifar_root):
    bundle = load_dataset("cifar10", data_dir=str(cifar_root), verify_checksums=False)
    assert (len(bundle.train), len(bundle.eval), bundle.spec.num_classes) == (103, 20, 10)
    assert bundle.train.inputs.dtype == torch.uint8  # normalised per batch, not held as floats
    raw = read_batch(cifar_root / CIFAR10_DIR / "data_batch_2")  # samples 21..41 of the training set
    inputs, targets = bundle.train.batch(torch.tensor([21, 22]))
    assert inputs.shape == (2, 3, 32, 32) and inputs.dtype == torch.float32
    assert targets.tolist() == raw["labels"][:2]
    expected_red = (torch.from_numpy(raw["data"][0, :1024]).float().view(32, 32) / 255 - 0.4914) / 0.2470
    torch.testing.assert_close(inputs[0, 0], expected_red)
    eval_targets = bundle.eval.batch(torch.arange(20))[1]
    assert eval_targets.tolist() == read_batch(cifar_root / CIFAR10_DIR / "test_batch")["labels"]


def test_cifar100_loads_fine_labels(cifar_root):
    bundle = load_dataset("cifar100", data_dir=str(cifar_root), verify_checksums=False)
    assert (len(bundle.train), len(bundle.eval), bundle.spec.num_classes) == (60, 10, 100)
    raw = read_batch(cifar_root / "cifar-100-python" / "train")
    assert bundle.train.batch(torch.arange(60))[1].tolist() == raw["fine_labels"]
    check_data_dir("cifar100", str(cifar_root), verify_checksums=False)


def test_cifar_model_runs_on_a_cifar_batch(cifar_root):
    bundle = load_dataset("cifar100", data_dir=str(cifar_root), verify_checksums=False)
    output = build_model("simple_cnn", bundle.spec)(bundle.train.batch([0, 1])[0])
    assert output.shape == (2, 100)


# --- bad data folders --------------------------------------------------------------------------


def _break_missing_dir(root):
    return root / "nowhere"


def _break_file_not_dir(root):
    (root / "afile").write_text("x")
    return root / "afile"


def _break_no_subfolder(root):
    (root / "empty").mkdir()
    return root / "empty"


def _break_missing_file(root):
    os.remove(root / CIFAR10_DIR / "data_batch_3")
    return root


def _break_truncated_file(root):
    path = root / CIFAR10_DIR / "data_batch_2"
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])
    return root


def _break_garbage_file(root):
    (root / CIFAR10_DIR / "test_batch").write_bytes(np.random.RandomState(0).bytes(5000))
    return root


def _break_missing_key(root):
    path = root / CIFAR10_DIR / "data_batch_1"
    content = read_batch(path)
    del content["labels"]
    write_py2_pickle(path, content)
    return root


def _break_wrong_shape(root):
    path = root / CIFAR10_DIR / "data_batch_4"
    content = read_batch(path)
    content["data"] = content["data"][:, :3000]
    write_py2_pickle(path, content)
    return root


def _break_label_count(root):
    path = root / CIFAR10_DIR / "data_batch_5"
    content = read_batch(path)
    content["labels"] = content["labels"][:-1]
    write_py2_pickle(path, content)
    return root


def _break_python3_pickle(root):
    # Re-pickled by Python 3 with bytes keys: torchvision would fail with KeyError: 'data'.
    path = root / CIFAR10_DIR / "data_batch_1"
    content = read_batch(path, encoding="bytes")
    path.write_bytes(pickle.dumps(content))
    return root


def _break_meta(root):
    write_py2_pickle(root / CIFAR10_DIR / "batches.meta", {"label_names": ["cat"]})
    return root


BREAKAGES = {
    "missing dir": (_break_missing_dir, ["does not exist", "--download", "cifar-10-batches-py"]),
    "file, not dir": (_break_file_not_dir, ["is not a folder", "--download"]),
    "no cifar subfolder": (_break_no_subfolder, ["has no cifar-10-batches-py folder", "--data-dir"]),
    "missing file": (_break_missing_file, ["lacks data_batch_3", "--download"]),
    "truncated file": (_break_truncated_file, ["data_batch_2 is not a readable CIFAR-10 batch", "truncated"]),
    "garbage file": (_break_garbage_file, ["test_batch is not a readable CIFAR-10 batch", "--download"]),
    "missing key": (_break_missing_key, ["data_batch_1", "key 'labels' is missing"]),
    "wrong shape": (_break_wrong_shape, ["data_batch_4", "shape (20, 3000)", "(N, 3072)"]),
    "label count": (_break_label_count, ["data_batch_5", "20 images but 19 labels"]),
    "python 3 pickle": (_break_python3_pickle, ["data_batch_1", "key 'data' is missing", "b'data'"]),
    "meta": (_break_meta, ["batches.meta", "must list 10 classes"]),
}


@pytest.fixture
def fresh_cifar10(tmp_path):
    return write_cifar10(tmp_path, num_train=103, num_test=20)


@pytest.mark.parametrize("case", BREAKAGES)
def test_bad_data_dir_is_a_user_error_saying_what_to_do(fresh_cifar10, case):
    breakage, phrases = BREAKAGES[case]
    data_dir = breakage(fresh_cifar10)
    for attempt in (lambda: check_data_dir("cifar10", str(data_dir), verify_checksums=False),
                    lambda: load_dataset("cifar10", data_dir=str(data_dir), verify_checksums=False)):
        with pytest.raises(UserError) as raised:
            attempt()
        message = str(raised.value)
        assert str(data_dir) in message
        for phrase in phrases:
            assert phrase in message


def test_pointing_at_the_batches_folder_names_its_parent(fresh_cifar10):
    inner = fresh_cifar10 / CIFAR10_DIR
    with pytest.raises(UserError, match="has no cifar-10-batches-py folder") as raised:
        check_data_dir("cifar10", str(inner))
    assert f"that is {fresh_cifar10}, the parent" in str(raised.value)


def test_missing_data_dir_option():
    with pytest.raises(UserError, match="--dataset cifar100 reads its files from --data-dir"):
        check_data_dir("cifar100", None)
    with pytest.raises(UserError, match="--data-dir"):
        load_dataset("cifar10")


def test_download_target_needs_only_a_writable_place(tmp_path):
    check_data_dir("cifar10", str(tmp_path / "new" / "deeper"), download=True)  # created by the download
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="is a file; --download needs a folder"):
        check_data_dir("cifar10", str(tmp_path / "afile"), download=True)
    with pytest.raises(UserError, match="not a writable folder"):
        check_data_dir("cifar10", str(tmp_path / "afile" / "below"), download=True)


def test_download_refuses_an_unwritable_target_before_fetching(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="is a file; --download needs a folder"):
        download_dataset("cifar100", str(tmp_path / "afile"))
    with pytest.raises(UserError, match="is a file; --download needs a folder"):
        load_dataset("cifar10", data_dir=str(tmp_path / "afile"), download=True)
    download_dataset("synthetic_image", None)  # nothing to fetch


# --- untrusted files: published checksums, a restricted unpickler -----------------------------


class _RunsCode:
    """Unpickled by a plain ``pickle.load``, this runs ``touch MARKER`` through os.system."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


class _EvalsCode(_RunsCode):
    def __reduce__(self):
        return eval, (f"__import__('pathlib').Path({self.marker!r}).touch()",)


def _plant(root, make, marker):
    """Replaces data_batch_2's labels by an object whose unpickling runs code."""
    path = root / CIFAR10_DIR / "data_batch_2"
    content = read_batch(path)
    content["labels"] = make(marker)
    path.write_bytes(pickle.dumps(content, protocol=2))
    return path


@pytest.mark.parametrize("make, global_name", [(_RunsCode, f"{os.system.__module__}.system"),
                                               (_EvalsCode, "__builtin__.eval")], ids=["os.system", "eval"])
def test_a_batch_that_would_run_code_is_refused_without_running_it(fresh_cifar10, tmp_path, make, global_name):
    marker = tmp_path / "ran"
    path = _plant(fresh_cifar10, make, marker)
    for verify in (False, True):  # refused by the unpickler; with checksums on, not even unpickled
        for attempt in (lambda: check_data_dir("cifar10", str(fresh_cifar10), verify_checksums=verify),
                        lambda: load_dataset("cifar10", data_dir=str(fresh_cifar10), verify_checksums=verify)):
            with pytest.raises(UserError) as raised:
                attempt()
            assert not marker.exists()
            message = str(raised.value)
            if verify:
                assert "data_batch_1" in message and "was not unpickled" in message
            else:
                assert str(path) in message and global_name in message and "nothing in it ran" in message
                assert "--download" in message
    pickle.loads(path.read_bytes())  # the file is a real threat: a plain unpickle runs it
    assert marker.exists()


@pytest.fixture
def published_cifar10(fresh_cifar10, monkeypatch):
    """A copy whose files' md5 sums stand in for torchvision's published ones (the official
    archive cannot be downloaded here); everything else is the real code path."""
    from torchvision import datasets

    folder = fresh_cifar10 / CIFAR10_DIR

    def md5(filename):
        return hashlib.md5((folder / filename).read_bytes()).hexdigest()

    cls = datasets.CIFAR10
    monkeypatch.setattr(cls, "train_list", [[f, md5(f)] for f, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[f, md5(f)] for f, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", dict(cls.meta, md5=md5(cls.meta["filename"])))
    return fresh_cifar10


def test_a_tampered_batch_fails_the_checksum_unless_the_check_is_skipped(published_cifar10):
    assert len(load_dataset("cifar10", data_dir=str(published_cifar10)).train) == 103  # checked, intact
    # One label changed: still a well-formed batch, no longer the published file.
    path = published_cifar10 / CIFAR10_DIR / "data_batch_3"
    content = read_batch(path)
    content["labels"][0] = (content["labels"][0] + 1) % 10
    write_py2_pickle(path, content)
    for attempt in (lambda: check_data_dir("cifar10", str(published_cifar10)),
                    lambda: load_dataset("cifar10", data_dir=str(published_cifar10))):
        with pytest.raises(UserError) as raised:
            attempt()
        message = str(raised.value)
        assert str(path) in message and "md5" in message
        assert "--no-verify-checksums" in message and "--download" in message
    bundle = load_dataset("cifar10", data_dir=str(published_cifar10), verify_checksums=False)
    assert bundle.train.batch([42])[1].item() == content["labels"][0]  # batch 3 starts at sample 42


def test_checksums_are_the_published_ones_and_on_by_default(fresh_cifar10):
    # The files tests write are not the official ones: refused by default, naming the first
    # file, torchvision's published md5 for it, and the way to accept a copy you trust.
    with pytest.raises(UserError) as raised:
        load_dataset("cifar10", data_dir=str(fresh_cifar10))
    message = str(raised.value)
    assert str(fresh_cifar10 / CIFAR10_DIR / "data_batch_1") in message
    assert "c99cafc152244af753f735de768cd75f" in message  # torchvision's CIFAR10.train_list
    assert "--no-verify-checksums" in message
