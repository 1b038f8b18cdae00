"""Deployment: evaluate, export with parity checks, predict, serve, and safe loading."""

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_user_paths import process_group
from torchvision.transforms import v2

from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit import export as export_module
from {{ cookiecutter.package_name }}.kit.checkpoint import load_checkpoint, load_model
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.kit.evaluate import main as evaluate
from {{ cookiecutter.package_name }}.kit.export import main as export
from {{ cookiecutter.package_name }}.kit.inference import Classifier, load_classifier, metadata_path
from {{ cookiecutter.package_name }}.kit.predict import input_files
from {{ cookiecutter.package_name }}.kit.predict import main as predict
from {{ cookiecutter.package_name }}.kit.predict import predict as classify
from {{ cookiecutter.package_name }}.model import ImageClassifier

PROJECT = Path(__file__).resolve().parents[1]
FORMATS = ("onnx", "torch_export", "state_dict")
ONE_EPOCH = ("--max_epochs", "1")
# The metadata file as export.py wrote it before the preprocessing was recorded as data:
# "preprocessing" was the data module's transform as text, and "data_class" preprocessed.
OLD_KEYS = ("format", "checkpoint", "class_names", "input_shape", "data_class", "mean", "std",
            "preprocessing", "output", "hyper_parameters", "versions", "parity")  # fmt: skip


def write_images(folder: Path) -> list[Path]:
    """Three small PNG files of different sizes and modes, and one file that is no image."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    files = []
    for i, (size, mode) in enumerate([((24, 20), "RGB"), ((8, 8), "L"), ((40, 32), "RGBA")]):
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        files.append(folder / f"image{i}.png")
        Image.fromarray(pixels).convert(mode).save(files[-1])
    files.append(folder / "corrupt.png")
    files[-1].write_bytes(b"\x89PNG\r\n\x1a\n this is not the rest of a PNG file")
    return files


def readme_recipe() -> str:
    """The Python block of the README's section on running without this project."""
    section = (PROJECT / "README.md").read_text().split("### On a machine without this project")[1]
    return section.split("```python")[1].split("```")[0]


def predictions(model: Path, images: Path, output: Path) -> list[dict]:
    """Run predict.py's main on the folder; it must report the corrupt file and exit with 1."""
    assert predict(["--model", str(model), str(images), "--output", str(output)]) == 1
    return json.loads(output.read_text())


def test_export_every_format_predicts_like_the_checkpoint(
    train: Callable,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    train(*ONE_EPOCH)
    artifacts = export(["--ckpt_path", "best", "--format", *FORMATS])
    assert [a.suffix for a in artifacts] == [".onnx", ".pt2", ".pt"]
    best = Path(json.loads(next(Path("runs").rglob("test_metrics.json")).read_text())["checkpoint"])
    for artifact in artifacts:
        assert artifact.parent == best.parent.parent / "export"
        metadata = json.loads(metadata_path(artifact).read_text())
        assert metadata["parity"]["batch_sizes"] == [1, 7]
        assert metadata["parity"]["max_abs_diff"] <= metadata["parity"]["tolerance"]
        assert metadata["input_shape"] == list(load_model(best)[0].hparams.input_shape)
        assert "torch" in metadata["versions"]
        # The preprocessing as data, checked against the data module's transform.
        assert metadata["metadata_version"] == 3
        assert metadata["inputs"] == "{{ cookiecutter.package_name }}.inputs"  # it preprocesses
        assert set(metadata["preprocessing"]) == {
            "mode", "resize", "interpolation", "center_crop", "value_range"
        }  # fmt: skip
        check = metadata["parity"]["preprocessing"]
        assert check["max_abs_diff"] <= check["tolerance"]
    program = torch.export.load(artifacts[1])
    assert all(weight.is_contiguous() for weight in program.state_dict.values())

    images = tmp_path / "images"
    write_images(images)
    expected = predictions(best, images, tmp_path / "checkpoint.json")
    assert [Path(row["file"]).name for row in expected] == [
        "corrupt.png", "image0.png", "image1.png", "image2.png"
    ]  # fmt: skip
    assert "corrupt.png" in capsys.readouterr().out
    assert expected[0]["error"] and expected[0]["class"] is None
    class_names = load_classifier(best).class_names
    assert all(row["class"] in class_names and row["error"] is None for row in expected[1:])
    for artifact in artifacts:
        rows = predictions(artifact, images, tmp_path / f"{artifact.suffix[1:]}.json")
        assert [row["class"] for row in rows] == [row["class"] for row in expected]
        for row, reference in zip(rows[1:], expected[1:], strict=True):
            assert row["probability"] == pytest.approx(reference["probability"], abs=1e-4)

    # A damaged copy of any artifact fails to load in one line that names it.
    for artifact in artifacts:
        damaged = tmp_path / f"damaged{artifact.suffix}"
        damaged.write_bytes(artifact.read_bytes()[:500])
        metadata_path(damaged).write_text(metadata_path(artifact).read_text())
        with pytest.raises(ConfigError, match=rf"^{damaged} is truncated or not") as error:
            load_classifier(damaged)
        assert "\n" not in str(error.value)

    # The README's recipe for a machine with only onnxruntime, numpy and Pillow agrees, its
    # preprocessing read from the metadata: with the checkpoint on an image of the input
    # size, with predict.py on the artifact for an image of another size, shape and mode.
    offline = tmp_path / "offline"
    offline.mkdir()
    shutil.copy(artifacts[0], offline / "model.onnx")
    shutil.copy(metadata_path(artifacts[0]), offline / "model.onnx.json")
    _, height, width = load_classifier(best).input_shape
    rng = np.random.default_rng(2)
    at_input_size = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    other = rng.integers(0, 256, (2 * height + 3, width + 5, 4), dtype=np.uint8)  # RGBA
    photos = ((at_input_size, best.resolve()), (other, artifacts[0].resolve()))
    monkeypatch.chdir(offline)
    for pixels, model in photos:
        Image.fromarray(pixels).save("photo.png")
        assert predict(["--model", str(model), "photo.png", "--output", "p.json"]) == 0
        (reference,) = json.loads(Path("p.json").read_text())
        capsys.readouterr()
        exec(readme_recipe(), {})
        name, probability = capsys.readouterr().out.rsplit(maxsplit=1)
        assert name == reference["class"]
        assert float(probability) == pytest.approx(reference["probability"], abs=1e-4)


def test_predict_writes_csv_and_refuses_other_output_suffixes(
    train: Callable, tmp_path: Path
) -> None:
    train(*ONE_EPOCH)
    checkpoint = next(Path("runs").rglob("last.ckpt"))
    files = write_images(tmp_path / "images")
    output = tmp_path / "preds.csv"
    assert predict(["--model", str(checkpoint), *map(str, files[:2]), "--output", str(output)]) == 0
    lines = output.read_text().splitlines()
    assert lines[0] == "file,class,probability,error" and len(lines) == 3
    with pytest.raises(SystemExit, match=r"--output preds.txt must end in .csv or .json"):
        predict(["--model", str(checkpoint), str(files[0]), "--output", "preds.txt"])
    with pytest.raises(SystemExit, match=r"^error: --output no/such/p.csv: no/such is not a fo"):
        predict(["--model", str(checkpoint), str(files[0]), "--output", "no/such/p.csv"])
    for size in ("0", "-1"):
        with pytest.raises(SystemExit, match=rf"^error: --batch_size must be a positive .*{size}$"):
            predict(["--model", str(checkpoint), str(files[0]), "--batch_size", size])


def test_files_of_another_type_in_a_folder_are_left_out_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from {{ cookiecutter.package_name }} import inputs

    files = write_images(tmp_path / "images")
    (tmp_path / "images" / "notes").mkdir()
    (tmp_path / "images" / "notes" / "readme.txt").write_text("not an input")
    assert input_files([tmp_path / "images"], inputs) == sorted(files)
    said = capsys.readouterr().err.strip()
    assert said == (
        f"{tmp_path / 'images'}: 1 file(s) left out, not {inputs.ACCEPTED} (such as readme.txt)"
    )
    input_files([tmp_path / "images" / "image0.png"], inputs)  # a file given by name: nothing
    assert capsys.readouterr().err == ""
    # The words name exactly the suffixes a folder is searched for.
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert inputs.ACCEPTED.endswith(f"({', '.join(IMG_EXTENSIONS)})")


def test_a_16_bit_grey_image_reads_as_its_8_bit_version(tmp_path: Path) -> None:
    """Scaled, not clipped: Pillow's own conversion to RGB turns 16-bit grey into 0 and 255."""
    from {{ cookiecutter.package_name }} import inputs

    pixels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    Image.fromarray(pixels).save(tmp_path / "8.png")
    Image.fromarray(pixels.astype(np.uint16) * 257).save(tmp_path / "16.png")
    with Image.open(tmp_path / "16.png") as sixteen:
        assert sixteen.mode.startswith("I;16")
    read = [np.asarray(inputs.read(tmp_path / name)) for name in ("8.png", "16.png")]
    assert np.array_equal(read[0], read[1])
    assert np.array_equal(np.asarray(inputs.read((tmp_path / "16.png").read_bytes())), read[0])


def test_export_that_misses_the_tolerance_fails_and_leaves_nothing(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    train(*ONE_EPOCH)

    def off_by_one(path: Path) -> Classifier:
        classifier = load_classifier(path)
        network = classifier.network
        classifier.network = lambda batch: network(batch) + 1
        return classifier

    monkeypatch.setattr(export_module, "load_classifier", off_by_one)
    with pytest.raises(
        SystemExit, match=r"does not match the model: max \|difference\| of logits 1"
    ):
        export(["--ckpt_path", "last", "--format", "state_dict"])
    assert not list(Path("runs").rglob("export/*"))


@pytest.fixture
def exported(train: Callable) -> list[Path]:
    """The best checkpoint of a one-epoch run, then its artifacts in every format."""
    train(*ONE_EPOCH)
    artifacts = [a.resolve() for a in export(["--ckpt_path", "best", "--format", *FORMATS])]
    checkpoint = json.loads(metadata_path(artifacts[0]).read_text())["checkpoint"]
    return [Path(checkpoint).resolve(), *artifacts]


def same_input(one: object, other: object) -> bool:
    """Equal model inputs, whether NumPy arrays (recorded preprocessing) or tensors."""
    return torch.equal(torch.as_tensor(one), torch.as_tensor(other))


def old_metadata(metadata: dict, data_class: bool) -> dict:
    """`metadata` as export.py wrote it before; without data_class, as it wrote it before that."""
    old = {key: metadata[key] for key in OLD_KEYS if key != "data_class" or data_class}
    old["preprocessing"] = metadata["transform"]
    parity = metadata["parity"]
    old["parity"] = {key: parity[key] for key in ("tolerance", "max_abs_diff", "batch_sizes")}
    return old


def test_an_artifact_exported_before_the_preprocessing_was_data_predicts_as_before(
    exported: list[Path], tmp_path: Path
) -> None:
    best, *artifacts = exported
    files = write_images(tmp_path / "images")[:-1]
    checkpoint = load_classifier(best)
    expected = classify(checkpoint, files)
    # Version 2 named no inputs module: the project's own (handed over) reads the inputs.
    for artifact in artifacts:
        metadata = json.loads(metadata_path(artifact).read_text())
        del metadata["inputs"]
        version_2 = tmp_path / f"version-2{artifact.suffix}"
        shutil.copy(artifact, version_2)
        metadata_path(version_2).write_text(json.dumps({**metadata, "metadata_version": 2}))
        then, now = load_classifier(version_2), load_classifier(artifact)
        for file in files:
            assert same_input(then.input_of(file), now.input_of(file))
    for artifact, data_class in itertools.product(artifacts, (True, False)):
        old = tmp_path / f"old-{data_class}{artifact.suffix}"
        shutil.copy(artifact, old)
        metadata = old_metadata(json.loads(metadata_path(artifact).read_text()), data_class)
        metadata_path(old).write_text(json.dumps(metadata, indent=2) + "\n")
        classifier = load_classifier(old)
        # Images go through the data module's transform, exactly as before.
        for file in files:
            assert same_input(classifier.input_of(file), checkpoint.input_of(file))
        rows = classify(classifier, files)
        assert [row["class"] for row in rows] == [row["class"] for row in expected]
        for row, reference in zip(rows, expected, strict=True):
            assert row["probability"] == pytest.approx(reference["probability"], abs=1e-4)


def test_an_inputs_module_from_outside_the_project_is_refused_unimported(
    exported: list[Path], tmp_path: Path
) -> None:
    onnx = exported[1]
    foreign = tmp_path / "foreign.onnx"
    shutil.copy(onnx, foreign)
    metadata = json.loads(metadata_path(onnx).read_text())
    metadata_path(foreign).write_text(json.dumps({**metadata, "inputs": "antigravity"}))
    with pytest.raises(ConfigError, match=r"names the inputs module 'antigravity', which is not"):
        load_classifier(foreign)
    assert "antigravity" not in sys.modules  # importing it would open a web browser


def test_a_transform_the_metadata_cannot_describe_leaves_preprocessing_to_the_data_module(
    train: Callable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    train(*ONE_EPOCH)
    last = next(Path("runs").rglob("last.ckpt"))
    described = DataModule.prediction_transform

    def mirrored(input_shape: tuple[int, int, int]) -> v2.Transform:
        return v2.Compose([v2.RandomHorizontalFlip(p=1), described(input_shape)])

    monkeypatch.setattr(DataModule, "prediction_transform", staticmethod(mirrored))
    (artifact,) = export(["--ckpt_path", "last", "--format", "onnx"])
    assert "prediction_transform is not one the metadata can record" in capsys.readouterr().err
    metadata = json.loads(metadata_path(artifact).read_text())
    assert metadata["preprocessing"] is None and "RandomHorizontalFlip" in metadata["transform"]
    files = write_images(tmp_path / "images")[:-1]
    classifier, checkpoint = load_classifier(artifact), load_classifier(last)
    for file in files:
        assert same_input(classifier.input_of(file), checkpoint.input_of(file))


# The only modules of the project that predicting and serving an exported artifact import: the
# entry scripts' hand-over (project.py) does not import the model.
ARTIFACT_MODULES = (
    "inputs", "kit", "kit.errors", "kit.inference", "kit.predict", "kit.project", "kit.serve",
    "project",
)  # fmt: skip
# Predict and serve artifacts in a fresh process, then list the modules it imported.
ISOLATED = """
import base64, json, sys
from pathlib import Path

from {{ cookiecutter.package_name }}.kit.inference import load_classifier
from {{ cookiecutter.package_name }}.kit.predict import predict
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.serve import ClassifierAPI, InputRequest
from {{ cookiecutter.package_name }}.project import project

use(project)  # as predict.py and serve.py do

image = Path(sys.argv[1])
answers = {}
for artifact in map(Path, sys.argv[2:]):
    (row,) = predict(load_classifier(artifact), [image])
    api = ClassifierAPI(artifact)
    api.setup("cpu")
    request = InputRequest(image=base64.b64encode(image.read_bytes()).decode())
    served = api.encode_response(api.predict(api.decode_request(request)))
    answers[artifact.name] = [row["class"], row["probability"], served["class"],
                                served["probability"]]
print(json.dumps({"modules": sorted(sys.modules), "answers": answers}))
"""


def test_an_exported_artifact_predicts_and_serves_without_lightning_or_the_project_classes(
    exported: list[Path], tmp_path: Path
) -> None:
    _, onnx, program, _ = exported
    image = write_images(tmp_path / "images")[0]
    # As export.py wrote it before the inputs module was recorded (version 2).
    version_2 = tmp_path / "version-2.onnx"
    shutil.copy(onnx, version_2)
    metadata = json.loads(metadata_path(onnx).read_text())
    del metadata["inputs"]
    metadata_path(version_2).write_text(json.dumps({**metadata, "metadata_version": 2}))
    command = [sys.executable, "-c", ISOLATED, str(image), str(onnx), str(program), str(version_2)]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.splitlines()[-1])
    tops = {module.split(".")[0] for module in result["modules"]}
    assert tops & {"lightning", "pytorch_lightning"} == set()
    package = "{{ cookiecutter.package_name }}"
    ours = sorted(m for m in result["modules"] if m.split(".")[0] == package)
    assert ours == [package, *(f"{package}.{name}" for name in ARTIFACT_MODULES)]
    for artifact in (onnx, program, version_2):
        predicted, probability, served, served_probability = result["answers"][artifact.name]
        (row,) = classify(load_classifier(artifact), [image])
        assert predicted == served == row["class"]
        assert probability == pytest.approx(row["probability"], abs=1e-6)
        assert served_probability == pytest.approx(row["probability"], abs=1e-6)
    # An ONNX file alone: onnxruntime runs it on NumPy arrays, and torch is not imported.
    finished = subprocess.run(
        command[:5], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.splitlines()[-1])
    assert {module.split(".")[0] for module in result["modules"]} & {"torch", "lightning"} == set()
    assert result["answers"][onnx.name][0] == result["answers"][onnx.name][2]


def test_evaluate_tests_best_and_last_into_the_run_folder(train: Callable) -> None:
    train(*ONE_EPOCH)
    run = next(Path("runs").rglob("test_metrics.json")).parent
    trained = json.loads((run / "test_metrics.json").read_text())
    metrics = evaluate(["--ckpt_path", "best", "--trainer.enable_progress_bar", "false"])
    written = json.loads((run / "eval_metrics.json").read_text())
    assert written["checkpoint"] == trained["checkpoint"]
    assert metrics["test/acc"] == pytest.approx(trained["test/acc"])
    assert written["test/acc"] == pytest.approx(metrics["test/acc"])
    evaluate(["--ckpt_path", "last"])
    assert json.loads((run / "eval_metrics.json").read_text())["checkpoint"].endswith("last.ckpt")
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]  # no new run folder
    # Each checkpoint tested keeps its own figures: the best one's are not overwritten.
    best = Path(trained["checkpoint"]).stem
    assert json.loads((run / f"eval_metrics-{best}.json").read_text()) == written
    last = json.loads((run / "eval_metrics-last.json").read_text())
    assert last["checkpoint"].endswith("last.ckpt")


class NotData:
    """Any class: pickling it into a checkpoint makes loading it run code."""


@pytest.fixture
def checkpoint_file(tmp_path: Path, make_datamodule: Callable) -> Callable[..., Path]:
    """Write a checkpoint of an untrained model with the given backbone width."""
    datamodule = make_datamodule()

    def write(width: int, weights_width: int | None = None, **extra: object) -> Path:
        def hparams(w: int) -> dict:
            backbone = {
                "class_path": "{{ cookiecutter.package_name }}.backbones.ConvNet",
                "init_args": {"width": w, "stages": 2},  # the head sees 4 * width features
            }
            return {
                "num_classes": datamodule.num_classes,
                "input_shape": datamodule.input_shape,
                "backbone": backbone,
            }

        weights = load_model_from(hparams(weights_width or width)).state_dict()
        path = tmp_path / f"width{width}.ckpt"
        torch.save(
            {
                "state_dict": weights,
                "hyper_parameters": hparams(width),
                "DataModule": datamodule.state_dict(),
                **extra,
            },
            path,
        )
        return path

    return write


def load_model_from(hparams: dict) -> ImageClassifier:
    from lightning.pytorch.cli import instantiate_module

    return instantiate_module(ImageClassifier, hparams)


def test_a_plain_checkpoint_loads(checkpoint_file: Callable) -> None:
    classifier = load_classifier(checkpoint_file(8))
    assert classifier.network.backbone.head[1].in_features == 32


def test_checkpoint_with_a_pickled_object_is_refused(checkpoint_file: Callable) -> None:
    path = checkpoint_file(8, extra=NotData())
    with pytest.raises(ConfigError, match=rf"{path} was refused: it holds a pickled Python object"):
        load_checkpoint(path)
    with pytest.raises(SystemExit, match=r"^error: .*width8.ckpt was refused"):
        predict(["--model", str(path), str(path)])


def test_truncated_checkpoint_gives_one_line_naming_it(checkpoint_file: Callable) -> None:
    path = checkpoint_file(8)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=rf"^{path} is truncated or not a torch file") as error:
        load_model(path)
    assert "\n" not in str(error.value)


def test_checkpoint_of_another_architecture_names_the_mismatch(
    checkpoint_file: Callable,
) -> None:
    path = checkpoint_file(8, weights_width=16)
    with pytest.raises(
        ConfigError,
        match=r"does not fit this architecture: .*backbone.features.0.0.weight "
        r"\(16, \d+, 3, 3\) \(now \(8, \d+, 3, 3\)\)",
    ):
        load_model(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(train: Callable, tmp_path: Path) -> Iterator[str]:
    train(*ONE_EPOCH)
    (artifact,) = export(["--ckpt_path", "best", "--format", "onnx"])
    with serving(artifact, tmp_path) as url:
        yield url


@contextlib.contextmanager
def serving(
    artifact: Path, tmp_path: Path, started: list[subprocess.Popen] | None = None
) -> Iterator[str]:
    """serve.py on an artifact or checkpoint, in its own process group on a free loopback
    port (its process appended to `started`)."""
    url = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, str(PROJECT / "serve.py"), "--model", str(artifact),
               "--port", url.rsplit(":", 1)[1], "--max_megabytes", "0.1"]  # fmt: skip
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    if started is not None:
        started.append(process)
    try:
        deadline = time.monotonic() + 120
        while not healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve.py did not start:\n{(tmp_path / 'server.log').read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):  # a test may have stopped it
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_bad_server_options_are_refused_in_one_line_before_it_starts() -> None:
    from {{ cookiecutter.package_name }}.kit.serve import main as serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for options, message in [
            (["--port", "99999"], "--port 99999: accepted: 1024 to 65535"),
            (["--workers", "0"], "--workers must be a positive integer, got 0"),
            (["--max_megabytes", "-1"], "--max_megabytes must be a positive number, got -1.0"),
            (["--port", str(port)], f"--port {port} on 127.0.0.1: Address already in use"),
        ]:
            with pytest.raises(SystemExit) as exit_info:
                serve(["--model", "model.onnx", *options])  # options first: no model is read
            assert exit_info.value.code == f"error: {message}"


def test_a_checkpoint_serves_as_it_predicts(train: Callable, tmp_path: Path) -> None:
    """LitServe's workers are spawned processes: they rebuild the project's model from the
    checkpoint without running serve.py's __main__, where the project is handed over."""
    train(*ONE_EPOCH)
    best = Path(json.loads(next(Path("runs").rglob("test_metrics.json")).read_text())["checkpoint"])
    files = write_images(tmp_path / "images")
    assert predict(["--model", str(best), str(files[0]), "--output", "ckpt.json"]) == 0
    (predicted,) = json.loads(Path("ckpt.json").read_text())
    started: list[subprocess.Popen] = []
    with serving(best, tmp_path, started) as url:
        status, answer = post(url, image_request(files[0]))
        # SIGTERM to serve.py alone (a container's stop, `kill PID`) ends its workers and
        # servers too, and frees the port: nothing is left answering.
        (process,) = started
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == 0, (tmp_path / "server.log").read_text()[-3000:]
        deadline = time.monotonic() + 30
        while process_group(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process_group(process.pid) == [], (tmp_path / "server.log").read_text()[-3000:]
        assert not healthy(url)
    assert status == 200, answer
    assert answer["class"] == predicted["class"]
    assert answer["probability"] == pytest.approx(predicted["probability"], abs=1e-5)


@pytest.mark.slow
def test_a_timm_backbone_trains_exports_with_parity_predicts_and_serves(
    train: Callable, tmp_path: Path
) -> None:
    pytest.importorskip("timm")  # the timm extra, which dev includes
    timm_flags = ["--model.backbone", "{{ cookiecutter.package_name }}.backbones.TimmBackbone"]
    train(*ONE_EPOCH, *timm_flags, "--model.backbone.model_name", "resnet10t")
    (artifact,) = export(["--ckpt_path", "best", "--format", "onnx"])
    parity = json.loads(metadata_path(artifact).read_text())["parity"]
    assert parity["max_abs_diff"] <= parity["tolerance"]
    files = write_images(tmp_path / "images")
    assert predict(["--model", str(artifact), str(files[0]), "--output", "timm.json"]) == 0
    (predicted,) = json.loads(Path("timm.json").read_text())
    with serving(artifact, tmp_path) as url:
        status, answer = post(url, image_request(files[0]))
    assert status == 200
    assert answer["class"] == predicted["class"]
    assert answer["probability"] == pytest.approx(predicted["probability"], abs=1e-4)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/predict", data=body, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def image_request(path: Path) -> bytes:
    return json.dumps({"image": base64.b64encode(path.read_bytes()).decode()}).encode()


@pytest.mark.slow
def test_server_answers_images_and_rejects_bad_requests(server: str, tmp_path: Path) -> None:
    files = write_images(tmp_path / "images")
    status, answer = post(server, image_request(files[0]))
    assert status == 200
    assert answer["class"] in answer["probabilities"]
    assert sum(answer["probabilities"].values()) == pytest.approx(1, abs=1e-4)
    assert answer["probability"] == max(answer["probabilities"].values())
    artifact = next(Path("runs").rglob("export/*.onnx"))
    assert answer["class"] == load_classifier(artifact).class_names[
        int(load_classifier(artifact).probabilities(
            load_classifier(artifact).input_of(files[0])[None]).argmax())
    ]  # fmt: skip

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda f: post(server, image_request(f)), files[:3] * 2))
    assert [status for status, _ in answers] == [200] * 6
    assert [a["class"] for _, a in answers[:3]] == [a["class"] for _, a in answers[3:]]

    shape = 'send JSON {"image": "<base64 of an image file>"}'
    body = image_request(files[0])
    for status, answer in (
        post(server, b"this is not JSON"),
        post(server, body, "application/x-www-form-urlencoded"),  # curl -d without -H
    ):
        assert (status, answer) == (422, {"detail": f"{shape} with Content-Type: application/json"})
    assert post(server, json.dumps({"picture": "x"}).encode())[0] == 422
    status, answer = post(server, json.dumps({"image": "not base64!"}).encode())
    assert (status, answer["detail"]) == (
        400,
        "'image' is not base64; send the bytes of an image file",
    )
    status, answer = post(server, image_request(files[-1]))
    assert status == 415 and "could not be decoded" in answer["detail"]
    big = json.dumps({"image": base64.b64encode(bytes(200_000)).decode()}).encode()
    assert post(server, big) == (413, {"detail": "Payload too large"})
    assert healthy(server)
