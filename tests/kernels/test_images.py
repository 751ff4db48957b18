"""The image path: GEMM and convolution operands read through image2d_t (options={"images": ...}).

PoCL supports images but not cl_khr_image2d_from_buffer: there every image is a copy refreshed
before each read, which is what the training tests below hold to eager (a stale image after an
optimizer step would be a wrong loss). Images over buffers themselves are tested where the device
shares them (NVIDIA's OpenCL driver on a desktop GPU).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from importlib import resources

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F
from helpers import LaunchProfile, assert_matches_eager
from helpers import cross_entropy_loss as _loss
from helpers import eager_training_step as _eager_step

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.errors import OptionError
from torch_adreno.kernels import ImageOperand, KernelSource
from torch_adreno.kernels.gemm_operands import image_width
from torch_adreno.models import MODELS
from torch_adreno.runtime import get_runtime
from torch_adreno.runtime.images import ImageViews, image_views, images_enabled
from torch_adreno.targets import REFERENCE_PROFILE

IMAGES = {"images": True}

# -- without a device ----------------------------------------------------------------------------


def test_images_option_values_and_environment() -> None:
    assert Config.from_options({}).images == "auto"
    assert Config.from_options({"images": True}).images is True
    assert Config.from_options({}, environ={"TORCH_ADRENO_IMAGES": "0"}).images is False
    with pytest.raises(OptionError, match="'auto', True or False"):
        Config.from_options({"images": "texture"})


def test_auto_follows_the_device_preference_and_true_needs_image_support() -> None:
    adreno = dataclasses.replace(REFERENCE_PROFILE, prefers_images=True)
    pocl_like = dataclasses.replace(REFERENCE_PROFILE, prefers_images=False)
    no_images = dataclasses.replace(REFERENCE_PROFILE, name="imageless", images=False, prefers_images=True)
    assert images_enabled("auto", adreno) and not images_enabled("auto", pocl_like)
    assert not images_enabled("auto", no_images)
    assert images_enabled(True, pocl_like) and not images_enabled(False, adreno)
    with pytest.raises(OptionError, match=r"'imageless'.*no image support.*images='auto' or False"):
        images_enabled(True, no_images)


def test_image_width_follows_tensor_rows_limits_and_pitch_alignment() -> None:
    profile = dataclasses.replace(REFERENCE_PROFILE, image2d_max_width=64, image2d_max_height=64)
    assert image_width((20, 12), profile) == 3           # a [out, in] weight: one row of 12 floats per row
    assert image_width((8, 4, 3, 3), profile) == 9       # a conv weight: one output channel per row
    assert image_width((8, 3, 5, 5), profile) == 50      # one 600-float row is 150 texels, past 64: 3 rows of 50
    assert image_width((6, 3, 5, 5), profile) is None    # 450 floats: no whole texels
    assert image_width((64 * 64 * 4 * 2,), profile) is None  # beyond 64 x 64 texels
    shared = dataclasses.replace(profile, image_from_buffer=True, image_pitch_alignment=8)
    assert image_width((20, 16), shared) == 8             # 2 tensor rows per image row: shares the buffer
    assert image_width((128, 784), dataclasses.replace(REFERENCE_PROFILE, image_from_buffer=True,
                                                       image_pitch_alignment=64)) == 256  # nearest 196
    assert image_width((5, 12), shared) == 3              # no aligned width: a copied image, by rows


# -- on the device -------------------------------------------------------------------------------

def _gemm_kernels(prof: torch_adreno.profile) -> set[str]:
    return {k.name for k in prof.kernels if k.kind == "gemm"}


def _operand_loads(source: str) -> list[str]:
    """The bodies of a GEMM kernel's operand loads (``<symbol>_load_a`` and ``<symbol>_load_b``,
    named through ``KERNEL_HELPER``)."""
    return re.findall(r"inline float KERNEL_HELPER\(_load_[ab]\)\(.*?\) \{\n(.*?)\n\}", source, re.S)


def _assert_kernel_reads_through_images(kernel: KernelSource) -> None:
    """``kernel`` (as launched) reads each image operand through its image and never through the
    operand's buffer: a LOAD_IMAGE_FLOAT (``read_imagef``) of the image argument is in the
    source, and the operand loads do not name the buffer."""
    names = [r.c_name for r in kernel.arguments]
    assert f"#define KERNEL_PARAMS {', '.join(r.declaration() for r in kernel.arguments)}" in kernel.source
    # The buffers, the index check's two arguments where the kernel has them, then the images.
    checks = 2 if kernel.checks_indices else 0
    assert len(names) == len(kernel.params) + checks + len(kernel.images), (kernel.name, names)
    loads = _operand_loads(kernel.source)
    assert loads and "read_imagef(" in kernel.source, f"{kernel.name}: no image read in the source"
    for j, operand in enumerate(kernel.images):
        buffer = names[kernel.params.index(operand.buffer)]
        image = names[len(kernel.params) + checks + j]
        assert image == f"{buffer}_image", (kernel.name, image, buffer)
        read = f"LOAD_IMAGE_FLOAT({image}," in kernel.source
        assert read, f"{kernel.name}: image {image} is bound but never read"
        readers = [body for body in loads if re.search(rf"\b{buffer}\b", body)]
        assert not readers, f"{kernel.name}: operand {operand.buffer} ({buffer}) is read from its buffer: {readers}"


def _assert_read_through_images(prof: LaunchProfile, before: dict[str, tuple[str, ...]]) -> None:
    """Every GEMM kernel the profile saw was launched with image operands bound, and the kernel
    that ran reads those operands through the images (binding alone proves nothing: a kernel that
    declares an image argument and loads the buffer passes with the images bound)."""
    bound = image_views(get_runtime()).bound_kernels
    gemms = _gemm_kernels(prof)
    assert gemms, "no GEMM kernel ran"
    missing = sorted(name for name in gemms if not bound.get(name))
    assert not missing, f"GEMM kernels launched without image operands: {missing}"
    assert any(name not in before for name in gemms), "no image kernel was bound by this run"
    launched = {k.name: k for k in prof.launched if k.kind == "gemm"}
    assert set(launched) == gemms
    for kernel in launched.values():
        assert kernel.images, f"{kernel.name}: launched without image operands"
        _assert_kernel_reads_through_images(kernel)


LAYERS = {
    "linear": (lambda x, w, b: F.linear(x, w, b), [(8, 12), (20, 12), (20,)]),
    "matmul_relu": (lambda a, b: torch.relu(a @ b), [(6, 8), (8, 12)]),
    "gram": (lambda a: a @ a.t(), [(12, 8)]),  # one buffer, both operands, one image
    "bmm": (torch.bmm, [(3, 4, 8), (3, 8, 12)]),
    "conv2d_padded": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(2, 4, 9, 9), (8, 4, 3, 3), (8,)]),
    "conv2d_strided": (lambda x, w: F.conv2d(x, w, stride=2), [(2, 3, 11, 11), (8, 3, 3, 3)]),
    # Grouped (a GEMM batch per group); depthwise convolutions are reductions and read no image.
    "conv2d_grouped": (lambda x, w: F.conv2d(x, w, padding=1, groups=2), [(2, 4, 8, 8), (4, 2, 3, 3)]),
    # The weight gradient (k = 2048 rows into 8 x 16 outputs) is split over k: images in the slices.
    "linear_split_k": (lambda x, w: F.linear(x, w), [(2048, 16), (8, 16)]),
}


@pytest.mark.device
@pytest.mark.parametrize("template", ["tiled", "direct"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_forward_and_gradients_through_images_match_eager(layer: str, template: str) -> None:
    """Both GEMM templates on any device: the local-memory one (GPUs) and the direct one (CPUs)."""
    fn, shapes = LAYERS[layer]
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(s, generator=generator) for s in shapes]
    before = dict(image_views(get_runtime()).bound_kernels)
    prof = assert_matches_eager(fn, *inputs, options=IMAGES,
                                kernel_choices=lambda choices: choices.with_gemm_template(template))
    _assert_read_through_images(prof, before)
    if layer == "linear_split_k":
        assert any("splitsum" in k.name for k in prof.kernels)


@pytest.mark.device
def test_tuned_image_kernels_match_eager(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner runs its candidates on scratch buffers: their images are bound and refreshed too
    (an unbound image argument fails the launch; a stale one, the candidate's check)."""
    monkeypatch.setenv("TORCH_ADRENO_CACHE", str(tmp_path))
    fn, shapes = LAYERS["linear"]
    before = dict(image_views(get_runtime()).bound_kernels)
    prof = assert_matches_eager(fn, *[torch.randn(s) for s in shapes], options={"images": True, "tune": True})
    _assert_read_through_images(prof, before)


@pytest.mark.device
@pytest.mark.parametrize("layer", ["linear", "conv2d_padded"])
def test_results_come_from_the_images_not_the_buffers(layer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behaviour, not source text: every image is made a copy, and its refresh before each read
    fills it with NaN instead of the buffer's bytes. A GEMM that reads its operands through the
    images then gives NaN wherever it multiplies an image operand; one that reads the buffers
    would still give eager's result."""
    from torch_adreno.runtime.images import BoundImage

    def poison(self: BoundImage, queue: cl.CommandQueue) -> cl.Event:
        nan = np.full(4, np.nan, dtype=np.float32)
        return cl.enqueue_fill_image(queue, self.image, nan, (0, 0), (self.operand.width, self.operand.height))

    monkeypatch.setattr(ImageViews, "_can_share", lambda self, buffer, operand: False)
    monkeypatch.setattr(BoundImage, "refresh", poison)
    fn, shapes = LAYERS[layer]
    inputs = [torch.randn(s, generator=torch.Generator().manual_seed(5)) for s in shapes]
    compiled = torch.compile(fn, backend="adreno", options=IMAGES, fullgraph=True, dynamic=False)
    with LaunchProfile() as prof:
        out = compiled(*inputs)
    gemms = [k for k in prof.launched if k.kind == "gemm"]
    assert gemms and all(k.images for k in gemms), [k.name for k in prof.launched]
    assert torch.isnan(out).all(), f"{int(torch.isnan(out).sum())} of {out.numel()} outputs read poisoned images"
    torch._dynamo.reset()
    monkeypatch.undo()  # images refreshed from the buffers again: eager's result
    torch.testing.assert_close(torch.compile(fn, backend="adreno", options=IMAGES)(*inputs), fn(*inputs),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.device
def test_images_off_binds_no_image() -> None:
    fn, shapes = LAYERS["linear"]
    views = image_views(get_runtime())
    bindings = views.bindings
    prof = assert_matches_eager(fn, *[torch.randn(s) for s in shapes], options={"images": False})
    assert _gemm_kernels(prof) and views.bindings == bindings


@pytest.mark.device
def test_images_true_on_a_device_without_images_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = get_runtime()
    monkeypatch.setattr(runtime, "profile", dataclasses.replace(runtime.profile, images=False))
    compiled = torch.compile(lambda a, b: a @ b, backend="adreno", options={"images": True, "compile_cache": False})
    with pytest.raises(Exception, match="has no image support"):
        compiled(torch.randn(4, 8), torch.randn(8, 4))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


@pytest.mark.device
@pytest.mark.parametrize("zero_copy", [False, "auto"], ids=["copy", "default"])
def test_training_step_with_images_matches_eager_through_replays(zero_copy) -> None:
    """The optimizer writes the weights between steps: every forward and backward after it must
    read the new values through its images (a copied image is refreshed before each read; in a
    replay too)."""
    model = _mlp()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    before = dict(image_views(get_runtime()).bound_kernels)
    step = torch_adreno.TrainingStep(model, _loss, opt, options={"images": True, "zero_copy": zero_copy})
    with LaunchProfile() as prof:
        for _ in range(6):
            x, y = torch.randn(16, 12, generator=generator), torch.randint(0, 8, (16,), generator=generator)
            torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
    assert step.replayed_steps == 4
    _assert_read_through_images(prof, before)
    step.synchronize()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"parameter {n}: {m}")
    step.close()


@pytest.mark.device
def test_images_shared_with_buffers_where_the_device_allows() -> None:
    runtime = get_runtime()
    if not runtime.profile.image_from_buffer:
        pytest.skip(f"{runtime.profile.name} has no cl_khr_image2d_from_buffer: images are copies here")
    views = image_views(runtime)
    shared = views.shared_made
    before = dict(views.bound_kernels)
    fn, _ = LAYERS["linear"]
    # 16-float rows: a pitch of 4 texels, which an alignment up to 4 shares directly; wider
    # alignments get a width that is a multiple of it (see image_width).
    prof = assert_matches_eager(fn, *[torch.randn(s) for s in [(8, 16), (64, 16), (64,)]], options=IMAGES)
    assert views.shared_made > shared
    _assert_read_through_images(prof, before)


@pytest.mark.device
def test_a_refused_shared_image_becomes_a_copy_and_released_buffers_drop_their_images(caplog) -> None:
    runtime = get_runtime()
    if runtime.profile.image_from_buffer:
        pytest.skip("the device shares images with buffers: nothing refuses here")
    caplog.set_level(logging.INFO, logger="torch_adreno")
    # Told the device shares, PoCL's driver refuses the image over the buffer: a copied image.
    views = ImageViews(runtime.context, dataclasses.replace(runtime.profile, image_from_buffer=True))
    operand = ImageOperand("x", 4, 4)
    buffer = cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, 256)
    entry = views.image_for(buffer, operand)
    assert not entry.shared and views.copies_made == 1
    assert views.image_for(buffer, operand) is entry and len(views) == 1
    del entry, buffer  # only the table holds the buffer now: the next new image releases both
    views.image_for(cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, 256), operand)
    assert len(views) == 1 and views.copies_made == 2
    views.image_for(cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, 512), ImageOperand("y", 8, 4))
    assert views.copies_made == views.refused == 3
    # The driver's refusal is said once for the device, in one line, not once per tensor.
    said = [r.getMessage() for r in caplog.records if "refuses images" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "copies instead" in said[0], said


def _train_reference_model(name: str, steps: int, images: bool):
    spec = MODELS[name]
    generator = torch.Generator().manual_seed(1)
    batches = [spec.batch(generator) for _ in range(steps)]
    torch.manual_seed(0)
    model = spec.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = torch_adreno.TrainingStep(model, _loss, opt, options={"images": images, "zero_copy": False})
    with LaunchProfile() as prof:
        losses = torch.stack([step(x, y) for x, y in batches])
    step.synchronize()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    step.close()
    return losses, state, prof, step.replayed_steps


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet_mini", "transformer", "mobilenet_mini"])
def test_reference_models_train_with_images_as_without(name: str) -> None:
    """Image reads return the buffer's very floats and the kernels multiply them in the same
    order: training with images on is bit-identical to training with them off (which the
    training tests hold to eager), compiled steps and replays alike. (About 2.5 minutes on PoCL,
    whose image reads are emulated in software.)"""
    steps = 4
    before = dict(image_views(get_runtime()).bound_kernels)
    with_images = _train_reference_model(name, steps, images=True)
    without = _train_reference_model(name, steps, images=False)
    _assert_read_through_images(with_images[2], before)
    assert with_images[3] == without[3] == steps - 2
    assert torch.equal(with_images[0], without[0]), (with_images[0], without[0])
    for key, value in without[1].items():
        assert torch.equal(with_images[1][key], value), key


@pytest.mark.device
@pytest.mark.parametrize("channel_type", ["float32", "float16"])
def test_image_load_macro_reads_every_element_of_float_and_half_images(channel_type: str) -> None:
    """The kernels' load of an image operand (``LOAD_IMAGE_FLOAT`` of ``gemm_image.cl``) over an
    image made by the runtime gives back each element of the buffer, at every texel and channel;
    half channels are widened (the half-storage formats compose with the same kernels)."""
    runtime = get_runtime()
    operand = ImageOperand("x", 3, 5, channel_type)
    values = np.arange(60, dtype=np.float16 if channel_type == "float16" else np.float32) * 0.5 - 7
    flags = cl.mem_flags
    buffer = cl.Buffer(runtime.context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=values)
    out = cl.Buffer(runtime.context, flags.WRITE_ONLY, 60 * 4)
    helper = resources.files("torch_adreno.kernels").joinpath("gemm_image.cl").read_text()
    program = cl.Program(runtime.context, helper + """
        __kernel void read_all(__global float* out, __read_only image2d_t image) {
            const int i = get_global_id(0);
            out[i] = LOAD_IMAGE_FLOAT(image, i, 3);
        }""").build()
    kernel = program.read_all
    views = ImageViews(runtime.context, runtime.profile)
    entry = views.image_for(buffer, operand)
    kernel.set_arg(0, out)
    kernel.set_arg(1, entry.image)
    entry.refresh(runtime.queue)
    cl.enqueue_nd_range_kernel(runtime.queue, kernel, (60,), None)
    result = np.empty(60, np.float32)
    cl.enqueue_copy(runtime.queue, result, out)
    np.testing.assert_array_equal(result, values.astype(np.float32))
