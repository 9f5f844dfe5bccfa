import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import rasterio
import tifffile
import torch
from PIL import Image

from segscale.cli.predict import EXIT_SKIPPED
from segscale.cli.predict import main as predict_main
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.inference.prediction.georeference import GDAL_METADATA, GDAL_NODATA, GEOTIFF_TAGS
from segscale.inference.prediction.inputs import UnreadableImageError
from segscale.inference.prediction.run import predict, run_prediction
from segscale.models.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from segscale.runs.folder import RunFolderLock
from tests.conftest import (
    compose_config,
    float_oracle_checkpoint,
    oracle_checkpoint,
    oracle_image,
    oracle_process,
)
from tests.helpers.declared_size import png_declaring
from tests.helpers.in_process import run_in_process
from tests.inference.prediction.test_georeference import NORTH_UP, UTM, geotiff


def _config(*overrides: str):
    return compose_config("predict", "accelerator=cpu", *overrides)


def _images(folder: Path) -> dict[str, np.ndarray]:
    """Two images whose sizes are not multiples of the tile; returns their true labels."""
    folder.mkdir()
    truths = {}
    for name, shape in (("wide", (37, 90)), ("tall", (70, 41))):
        mask = np.random.default_rng(len(name)).integers(0, 3, shape).astype(np.uint8)
        Image.fromarray(oracle_image(mask)).save(folder / f"{name}.png")
        truths[name] = mask
    return truths


def test_predict_writes_palette_masks_and_overlays(tmp_path: Path):
    truths = _images(tmp_path / "in")
    colours = [[255, 0, 0], [0, 255, 0], [0, 0, 255]]
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt", colours=colours)
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    written = predict(cfg)
    assert sorted(p.name for p in written) == ["tall.png", "wide.png"]
    for name, truth in truths.items():
        mask = Image.open(tmp_path / "out" / f"{name}.png")
        assert mask.mode == "P" and mask.getpalette()[:9] == [255, 0, 0, 0, 255, 0, 0, 0, 255]
        np.testing.assert_array_equal(np.asarray(mask), truth)
        overlay = np.asarray(Image.open(tmp_path / "out" / f"{name}_overlay.png"))
        assert overlay.shape == (*truth.shape, 3)
    assert not list((tmp_path / "out").glob(".*partial"))


@pytest.fixture(scope="module")
def two_process_prediction(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One prediction on two processes (~10 s of spawned ranks), read by the tests below:
    its output folder, the true labels, the cut JPEGs and its ``PredictionRun``.

    Its list names two JPEGs cut short (they fail only when decoded) and two good images:
    the ranks take images 0, 2 and 1, 3, so each skips one and predicts one.
    """
    tmp_path = tmp_path_factory.mktemp("two_processes")
    truths = _images(tmp_path / "in")
    jpegs = [_truncated_jpeg(tmp_path / "in" / f"{name}.jpg") for name in ("cut1", "cut2")]
    listed = "in/cut1.jpg\nin/cut2.jpg\nin/wide.png\n# a comment\nin/tall.png\n"
    (tmp_path / "list.txt").write_text(listed)
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'list.txt'}",
        "devices=2",
        "format=tif",
        "overlay=false",
        "skip_unreadable=true",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    run = run_prediction(cfg)
    return {"out": tmp_path / "out", "truths": truths, "jpegs": jpegs, "run": run}


@pytest.mark.slow
@pytest.mark.spawn  # the ranks are spawned (Fabric's ddp_spawn), as every platform starts them
def test_predict_splits_images_across_two_processes_and_writes_tiff(two_process_prediction):
    out = two_process_prediction["out"]
    for name, truth in two_process_prediction["truths"].items():
        np.testing.assert_array_equal(tifffile.imread(out / f"{name}.tif"), truth)
    assert sorted(p.name for p in out.iterdir()) == ["tall.tif", "wide.tif"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("input={tmp}/nothing.png", "input=.*nothing.png' does not exist; expected an image"),
        ("input={tmp}/notes.md", "input=.*is not an image, a folder or a .txt list"),
        ("ckpt={tmp}/missing.ckpt", r"ckpt=.*no such file; expected a .ckpt"),
        ("ckpt={tmp}/in/wide.png", "ckpt=.*is not a checkpoint"),
        ("format=jpg", "format='jpg' is not allowed"),
        # the window is built through build(), which lets our ConfigError through
        ("inference.overlap=1.5", r"inference.overlap=1.5 is not allowed"),
    ],
)
def test_bad_input_names_the_key(tmp_path: Path, override: str, message: str):
    _images(tmp_path / "in")
    (tmp_path / "notes.md").write_text("not an image")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        override.format(tmp=tmp_path),
    )
    with pytest.raises(ConfigError, match=message):
        predict(cfg)


def _corrupt(folder: Path) -> list[str]:
    """Beside the good images: random bytes named .png, and a PNG cut in half."""
    (folder / "x.png").write_bytes(np.random.default_rng(0).bytes(500))
    data = (folder / "wide.png").read_bytes()
    (folder / "cut.png").write_bytes(data[: len(data) // 2])
    return ["cut.png", "x.png"]


def _predict_args(tmp_path: Path, *overrides: str) -> list[str]:
    """``predict.py``'s arguments on ``tmp_path/in`` with the oracle, writing ``tmp_path/out``."""
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    return [
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "accelerator=cpu",
        "inference.tile_size=32",
        *overrides,
    ]


def test_unreadable_inputs_are_all_listed_before_anything_is_predicted(tmp_path: Path):
    _images(tmp_path / "in")
    bad = _corrupt(tmp_path / "in")
    args = _predict_args(tmp_path)
    result = run_in_process(predict_main, *args, cwd=tmp_path, program="predict.py")
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "Traceback" not in output
    assert "2 input image(s) of input=" in output and "nothing was predicted" in output
    for name in bad:
        assert f"{tmp_path / 'in' / name}: cannot be read" in output
    assert "wide.png:" not in output and "tall.png:" not in output
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_skip_unreadable_predicts_the_others_and_exits_3(tmp_path: Path):
    truths = _images(tmp_path / "in")
    bad = _corrupt(tmp_path / "in")
    # ``python predict.py`` in a process of its own: its exit status 3 is the process's.
    command = oracle_process("predict.py", *_predict_args(tmp_path))
    command.append("skip_unreadable=true")
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_SKIPPED, output[-3000:]
    assert "Traceback" not in output and "skipping 2 unreadable input image(s)" in output
    assert all(name in output for name in bad)
    assert "2 image(s) predicted, 2 skipped as unreadable" in output
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["tall.png", "tall_overlay.png", "wide.png", "wide_overlay.png"]
    for name, truth in truths.items():
        np.testing.assert_array_equal(
            np.asarray(Image.open(tmp_path / "out" / f"{name}.png")), truth
        )


def _truncated_jpeg(path: Path) -> Path:
    """A JPEG whose header is whole and whose body is cut: it fails only when decoded."""
    pixels = np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_an_image_that_fails_while_decoding_is_named_and_can_be_skipped(tmp_path: Path):
    _images(tmp_path / "in")
    jpeg = _truncated_jpeg(tmp_path / "in" / "a_cut.jpg")  # first in name order
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    common = (f"ckpt={ckpt}", f"input={tmp_path / 'in'}", "inference.tile_size=32")
    cfg = _config(*common, f"output_dir={tmp_path / 'stop'}")
    with pytest.raises(UnreadableImageError) as stopped:
        predict(cfg)
    assert f"{jpeg}: cannot be decoded: image file is truncated" in str(stopped.value)
    assert not list((tmp_path / "stop").iterdir())  # the run stopped at the first image
    run = run_prediction(_config(*common, f"output_dir={tmp_path / 'out'}", "skip_unreadable=true"))
    assert sorted(p.name for p in run.written) == ["tall.png", "wide.png"]
    assert [(p.path, p.reason.split(":")[0]) for p in run.skipped] == [(jpeg, "cannot be decoded")]
    assert not list((tmp_path / "out").glob("a_cut*")) and not list((tmp_path / "out").glob(".*"))


@pytest.mark.slow
def test_two_processes_report_the_images_skipped_on_every_rank(two_process_prediction):
    run = two_process_prediction["run"]
    assert sorted(p.name for p in run.written) == ["tall.tif", "wide.tif"]
    assert sorted(p.path for p in run.skipped) == two_process_prediction["jpegs"]


def test_header_problems_name_the_limit_and_the_channels(tmp_path: Path):
    _images(tmp_path / "in")
    png_declaring(tmp_path / "in" / "bomb.png", 20000, 20000)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "in" / "grey.png")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    common = (f"ckpt={ckpt}", f"input={tmp_path / 'in'}", f"output_dir={tmp_path / 'out'}")
    with pytest.raises(UnreadableImageError) as refused:
        predict(_config(*common))
    message = str(refused.value)
    assert "bomb.png: cannot be read: its header declares 20000 x 20000 = 400000000" in message
    assert "max_image_pixels for predict.py" in message
    assert f"grey.png: has 1 channels, the network of ckpt={str(ckpt)!r} takes 3" in message
    with pytest.raises(UnreadableImageError, match="limit of 2000 pixels"):
        predict(_config(*common, "max_image_pixels=2000"))  # 37 x 90 = 3330 pixels
    with pytest.raises(ConfigError, match="max_image_pixels=-1 is not allowed"):
        predict(_config(*common, "max_image_pixels=-1"))
    with pytest.raises(ConfigError, match="skip_unreadable='yes' is not allowed"):
        predict(_config(*common, "skip_unreadable=yes"))


def _geotiff_input(folder: Path) -> np.ndarray:
    """``folder/scene.tif``: a GeoTIFF in UTM 33N (origin and pixel size not round) whose
    labels the oracle predicts; returns them."""
    folder.mkdir()
    truth = np.random.default_rng(5).integers(0, 3, (37, 90)).astype(np.uint8)
    geotiff(folder / "scene.tif", oracle_image(truth), crs=UTM, transform=NORTH_UP, nodata=0)
    return truth


def test_predict_gives_tiff_mask_and_overlay_the_georeference_of_a_geotiff(tmp_path: Path):
    truth = _geotiff_input(tmp_path / "in")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
        "format=tif",
    )
    assert [p.name for p in predict(cfg)] == ["scene.tif"]
    with rasterio.open(tmp_path / "in" / "scene.tif") as image:
        crs, transform, size = image.crs, image.transform, (image.width, image.height)
    for name in ("scene.tif", "scene_overlay.tif"):
        with rasterio.open(tmp_path / "out" / name) as written:
            assert written.crs == crs and written.crs.to_epsg() == 32633
            assert written.transform == transform == NORTH_UP
            assert (written.width, written.height) == size
            assert written.nodata is None
    with rasterio.open(tmp_path / "out" / "scene.tif") as mask:
        np.testing.assert_array_equal(mask.read(1), truth)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "scene.tif",
        "scene_overlay.tif",
    ]


def test_predict_writes_world_files_beside_png_outputs_of_a_geotiff(tmp_path: Path):
    _geotiff_input(tmp_path / "in")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    predict(cfg)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "scene.pgw",
        "scene.png",
        "scene_overlay.pgw",
        "scene_overlay.png",
    ]
    centre = NORTH_UP @ (0.5, 0.5)
    expected = [NORTH_UP.a, NORTH_UP.d, NORTH_UP.b, NORTH_UP.e, *centre]
    for name in ("scene", "scene_overlay"):
        lines = (out / f"{name}.pgw").read_text().splitlines()
        assert [float(line) for line in lines] == expected
        with rasterio.open(out / f"{name}.png") as written:
            assert written.transform == NORTH_UP and (written.width, written.height) == (90, 37)


@pytest.mark.parametrize("file_format", ["png", "tif"])
def test_predict_of_an_image_without_georeferencing_writes_todays_files(
    tmp_path: Path, file_format: str
):
    (tmp_path / "in").mkdir()
    truth = np.random.default_rng(6).integers(0, 3, (37, 90)).astype(np.uint8)
    tifffile.imwrite(tmp_path / "in" / "plain.tif", oracle_image(truth))
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
        "overlay=false",
        f"format={file_format}",
    )
    predict(cfg)
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"plain.{file_format}"]
    if file_format == "png":
        return
    mask = tmp_path / "out" / "plain.tif"
    with tifffile.TiffFile(mask) as tif:
        page = tif.pages[0]
        assert not {tag.code for tag in page.tags} & {*GEOTIFF_TAGS, GDAL_METADATA, GDAL_NODATA}
        colormap = page.colormap
    # Byte for byte what tifffile.memmap wrote before georeferencing existed.
    reference = tifffile.memmap(
        tmp_path / "reference.tif",
        shape=truth.shape,
        dtype=np.uint8,
        photometric="palette",
        colormap=colormap,
    )
    reference[:] = truth
    reference.flush()
    del reference
    assert mask.read_bytes() == (tmp_path / "reference.tif").read_bytes()


def test_a_dangling_link_as_input_is_said_to_lead_nowhere(tmp_path: Path):
    (tmp_path / "scene.tif").symlink_to(tmp_path / "gone.tif")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    out = tmp_path / "out"
    cfg = _config(f"ckpt={ckpt}", f"input={tmp_path / 'scene.tif'}", f"output_dir={out}")
    with pytest.raises(ConfigError, match=r"is a link to .*gone.tif, which does not exist"):
        predict(cfg)


def test_inputs_whose_outputs_would_share_a_name_are_refused_before_anything_is_written(
    tmp_path: Path,
):
    truths = _images(tmp_path / "in")
    Image.fromarray(oracle_image(truths["wide"])).save(tmp_path / "in" / "wide_overlay.png")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    common = (f"ckpt={ckpt}", f"input={tmp_path / 'in'}", "inference.tile_size=32")
    result = run_in_process(
        predict_main,
        *common,
        "accelerator=cpu",
        f"hydra.run.dir={tmp_path / 'out'}",
        program="predict.py",
    )
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in output
    assert (
        f"{tmp_path / 'in/wide.png'} and {tmp_path / 'in/wide_overlay.png'} would both " in output
    )
    assert "'wide_overlay'" in output and "overlay=false" in output
    assert not list((tmp_path / "out").glob("*.png"))
    written = predict(_config(*common, "overlay=false", f"output_dir={tmp_path / 'masks'}"))
    assert sorted(p.name for p in written) == ["tall.png", "wide.png", "wide_overlay.png"]


def test_images_of_another_pixel_type_than_the_checkpoint_s_are_refused(tmp_path: Path):
    truths = _images(tmp_path / "in")
    image = oracle_image(truths["wide"])
    tifffile.imwrite(tmp_path / "in" / "deep.tif", image.astype(np.uint16) * 257)
    tifffile.imwrite(tmp_path / "in" / "float.tif", image.astype(np.float32) / 255)
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")  # trained on uint8: max_value 255
    cfg = _config(f"ckpt={ckpt}", f"input={tmp_path / 'in'}", f"output_dir={tmp_path / 'out'}")
    with pytest.raises(UnreadableImageError) as refused:
        predict(cfg)
    message = str(refused.value)
    expected = (
        f"the network of ckpt={str(ckpt)!r} takes uint8 pixels (full intensity 255); "
        "convert the image"
    )
    assert f"deep.tif: its pixels are uint16, {expected}" in message
    assert f"float.tif: its pixels are float32, {expected}" in message
    assert "wide.png" not in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_float_image_with_nan_pixels_is_refused(tmp_path: Path):
    content = load_checkpoint_file(oracle_checkpoint(tmp_path / "o.ckpt"), "ckpt")
    content["segscale"]["max_value"] = 1.0  # a network trained on float images
    save_checkpoint_file(content, tmp_path / "float.ckpt")
    image = np.full((20, 20, 3), 0.5, np.float32)
    image[3, 4, 1] = np.nan
    tifffile.imwrite(tmp_path / "nan.tif", image)
    cfg = _config(
        f"ckpt={tmp_path / 'float.ckpt'}",
        f"input={tmp_path / 'nan.tif'}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    with pytest.raises(ConfigError, match=r"nan.tif: has NaN or infinite pixels"):
        predict(cfg)


def test_accelerator_gpu_without_a_gpu_says_so_and_how_to_use_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _images(tmp_path / "in")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = compose_config(
        "predict",
        "accelerator=gpu",
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
    )
    with pytest.raises(ConfigError) as refused:
        predict(cfg)
    message = str(refused.value)
    assert message.startswith("accelerator=gpu: no GPU is visible to this process")
    assert "give accelerator=cpu" in message and "indices" not in message


def _float_inputs(folder: Path) -> dict[str, np.ndarray]:
    """``right.tif`` of floats 0-1 (as the training images), ``scaled.tif`` of 0-255."""
    folder.mkdir()
    mask = np.random.default_rng(0).integers(0, 3, (40, 50)).astype(np.uint8)
    pixels = oracle_image(mask).astype(np.float32)
    tifffile.imwrite(folder / "right.tif", pixels / 255)
    tifffile.imwrite(folder / "scaled.tif", pixels)
    return {"right": mask, "scaled": mask}


@pytest.mark.parametrize(
    ("recorded", "overrides", "code"),
    [
        ([[0.0, 1.0]] * 3, (), EXIT_BAD_INPUT),
        ([[0.0, 1.0]] * 3, ("check_value_range=false",), 0),
        (None, (), 0),  # a record without a range (the data gave none): no check
    ],
    ids=["refused", "check_value_range=false", "no range recorded"],
)
def test_a_float_image_of_0_to_255_for_a_network_of_0_to_1_is_refused_naming_both(
    tmp_path: Path, recorded, overrides: tuple[str, ...], code: int
):
    _float_inputs(tmp_path / "in")
    ckpt = float_oracle_checkpoint(tmp_path / "float.ckpt", recorded)
    args = [
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "accelerator=cpu",
        "inference.tile_size=32",
        *overrides,
    ]
    result = run_in_process(predict_main, *args, cwd=tmp_path, program="predict.py")
    output = result.stdout + result.stderr
    assert result.returncode == code, output[-3000:]
    assert "Traceback" not in output
    written = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    if code:
        assert f"{tmp_path / 'in/scaled.tif'}: " in output
        assert "far from the training images' 0 to 1, which the network of ckpt=" in output
        assert "check_value_range=false" in output
        assert "scaled.png" not in written
    else:
        assert "scaled.png" in written and "right.png" in written


def test_check_value_range_takes_true_or_false(tmp_path: Path):
    _float_inputs(tmp_path / "in")
    ckpt = float_oracle_checkpoint(tmp_path / "float.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        "check_value_range=maybe",
    )
    with pytest.raises(ConfigError, match="check_value_range='maybe' is not allowed"):
        predict(cfg)


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _predict_into(tmp_path: Path, folder: Path, *overrides: str):
    """``predict.py`` in this process, writing masks, log and record into ``folder``."""
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    args = [
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"hydra.run.dir={folder}",  # output_dir too, by default
        "accelerator=cpu",
        "inference.tile_size=32",
        *overrides,
    ]
    return run_in_process(predict_main, *args, cwd=tmp_path, program="predict.py")


def test_a_second_prediction_into_a_finished_one_s_folder_is_refused_and_changes_nothing(
    tmp_path: Path,
):
    _images(tmp_path / "in")
    folder = tmp_path / "run"
    first = _predict_into(tmp_path, folder)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(folder)
    assert {".hydra/config.yaml", "wide.png", "tall_overlay.png", "predict.log"} <= set(before)
    second = _predict_into(tmp_path, folder, "overlay=false")
    output = second.stdout + second.stderr
    assert second.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "Traceback" not in output
    assert f"{folder} already holds 4 file(s) or folder(s) that this prediction" in output
    assert "(tall.png, tall_overlay.png, wide.png, wide_overlay.png)" in output
    assert _files(folder) == before  # masks, record and log as the first left them


def test_a_prediction_into_a_folder_a_running_one_holds_is_refused(tmp_path: Path):
    _images(tmp_path / "in")
    folder = tmp_path / "run"
    with RunFolderLock(folder, what="prediction"):  # a prediction running there
        refused = _predict_into(tmp_path, folder)
        held = _files(folder)
    output = refused.stdout + refused.stderr
    assert refused.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "Traceback" not in output
    assert f"{folder} is in use by another prediction (pid {os.getpid()}" in output
    # No mask, no record; the log Hydra opened for it before it was refused holds nothing.
    assert sorted(held) == [".lock", "predict.log"] and held["predict.log"][0] == b""


def test_a_folder_left_by_a_prediction_refused_for_its_input_takes_the_next_one(
    tmp_path: Path,
):
    truths = _images(tmp_path / "in")
    folder = tmp_path / "run"
    refused = _predict_into(tmp_path, folder, "max_image_pixels=-1")
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr[-3000:]
    done = _predict_into(tmp_path, folder)
    assert done.returncode == 0, done.stderr[-3000:]
    # Each launch its own record: the refused one's kept, this one's beside it.
    assert "max_image_pixels: -1" in (folder / ".hydra/config.yaml").read_text()
    assert "max_image_pixels: -1" not in (folder / ".hydra/launch-2/config.yaml").read_text()
    for name, truth in truths.items():
        np.testing.assert_array_equal(np.asarray(Image.open(folder / f"{name}.png")), truth)
