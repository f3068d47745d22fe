"""Image prefill time per tile: SmolVLM-256M's vision tower (12 SigLIP layers, 768 wide,
512-pixel tiles of 16-pixel patches, pixel shuffle 4) with seeded random weights, in
front of the tiny Idefics3 fixture's text model and tokenizer, served through the
official openai client.

    uv run python bench/gpu_vision.py --backend cuda [--repeats 5] [--out FILE]
    uv run python bench/gpu_vision.py --backend cpu --repeats 2      # the NumPy figure

Each request carries one fresh random 1000 x 1000 image (resized to 1024: 2 x 2 tiles
plus the global view = 5 windows; fresh pixels, so no cached prefix is reused) and asks
for one token; a text-only request of the same prompt length is the baseline. Per
window = (image time - text time) / 5. Writes JSON (bench/results/ by convention) with
the commit and the machine.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import openai
from _report import git_commit, write_json  # bench/ is this script's folder
from helios_ignition.checkpoint.geometry import VisionGeometry
from helios_ignition.checkpoint.safetensors_loader import load_safetensors_dir
from helios_ignition.export import export_core
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime.native_model import NativeModel
from helios_serve.server import Server
from helios_tools.core import generate_key, write_key_pair
from PIL import Image
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "idefics3_tiny"
VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
          "num_attention_heads": 12, "image_size": 512, "patch_size": 16,
          "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}
RECIPE = '''
import dataclasses, importlib.util
from helios_contract.schema import frontend_pb2 as fe
spec = importlib.util.spec_from_file_location("fixture_recipe", {path!r})
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)
base.TILING = fe.ImageTiling(tile_pixels=512, patch_pixels=16, resize_longest_edge=1024,
                             resample=fe.IMAGE_RESAMPLE_LANCZOS, rescale=1 / 255,
                             mean=[0.5] * 3, std=[0.5] * 3)


def make_recipe(checkpoint):
    recipe = base.make_recipe(checkpoint)
    layout = recipe.frontend.image_token_layout
    layout.patches_per_feature = 16
    return dataclasses.replace(recipe, capacities=dataclasses.replace(
        recipe.capacities, prefill_tokens=(512,), context_tokens=1024, prepared_pages=128,
        image_windows=5, image_feature_slots=5 * 64))
'''


def write_checkpoint(folder: Path, seed: int) -> None:
    """The fixture's text model and tokenizer with a random SmolVLM-256M vision tower."""
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(FIXTURE / "checkpoint" / name, folder / name)
    config = json.loads((FIXTURE / "checkpoint" / "config.json").read_text())
    config["vision_config"] = {**config["vision_config"], **VISION}
    config["scale_factor"] = 4
    (folder / "config.json").write_text(json.dumps(config))
    text = load_safetensors_dir(FIXTURE / "checkpoint")
    shapes = dataclasses.replace(text.geometry, vision=None).tensor_shapes()
    tensors = {"model.text_model." + n[len("model."):] if n.startswith("model.") else n:
               text.tensor(n) for n in shapes}
    rng = np.random.default_rng(seed)
    d, p = VISION["hidden_size"], VISION["patch_size"]
    geometry = load_vision_geometry(config)
    for name, shape in geometry.tensor_shapes().items():
        scale = 1.0 if name.endswith("layer_norm1.weight") or name.endswith(
            "layer_norm2.weight") or name.endswith("post_layernorm.weight") else 0.02
        array = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("patch_embedding.weight"):
            array = array.reshape(d, 3, p, p)
        tensors[name] = array
    save_file(tensors, str(folder / "model.safetensors"))


def load_vision_geometry(config: dict):
    v = config["vision_config"]
    return VisionGeometry(hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
                          num_layers=v["num_hidden_layers"], num_heads=v["num_attention_heads"],
                          image_size=v["image_size"], patch_size=v["patch_size"],
                          layer_norm_eps=v["layer_norm_eps"], scale_factor=config["scale_factor"],
                          text_hidden=config["text_config"]["hidden_size"])


def image_url(rng) -> str:
    pixels = rng.integers(0, 256, (1000, 1000, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpu-vision-"))
    write_checkpoint(work / "checkpoint", seed=0)
    (work / "recipe.py").write_text(RECIPE.format(path=str(FIXTURE / "recipe.py")))
    key = work / "key.pem"
    write_key_pair(generate_key(), key)
    targets = ()
    if args.backend == "cuda":
        from helios_serve.runtime.cuda import driver as drv  # cuda-python: optional

        cu = drv.require_driver()
        dev = drv.call("cuDeviceGet", cu.cuDeviceGet(0))
        major, minor = (drv.call("attr", cu.cuDeviceGetAttribute(attr, dev)) for attr in (
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        targets = (f"sm_{major}{minor}",)
    started = time.perf_counter()
    export_core(work / "recipe.py", checkpoint=str(work / "checkpoint"), key_path=key,
                namespace="bench.vision", out=work / "core", targets=targets)
    export_s = time.perf_counter() - started
    bootstrap = Bootstrap.load(work / "core", [Path(str(key) + ".pub").read_bytes()],
                               "bench.vision")
    settings = resolve(ServeOptions(port=0, max_active=1, queue_capacity=2), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, args.backend,
                             max_concurrency=1)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=600)
    rng = np.random.default_rng(1)
    image_s, text_s, prompt_tokens = [], [], 0
    try:
        for i in range(args.repeats + 1):  # the first of each is a warm-up
            messages = [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image_url(rng)}},
                {"type": "text", "text": f"What is in this image? ({i})"}]}]
            t = time.perf_counter()
            reply = client.chat.completions.create(model="idefics3-tiny", messages=messages,
                                                   max_tokens=1, temperature=0)
            if i:
                image_s.append(time.perf_counter() - t)
            prompt_tokens = reply.usage.prompt_tokens
            text = "a " * (prompt_tokens - 12) + f"({i})"  # about the same prompt length
            t = time.perf_counter()
            client.chat.completions.create(model="idefics3-tiny", max_tokens=1, temperature=0,
                                           messages=[{"role": "user", "content": text}])
            if i:
                text_s.append(time.perf_counter() - t)
    finally:
        server.stop()
        bootstrap.close()
    windows = 5
    image, text = statistics.median(image_s), statistics.median(text_s)
    result = {
        "bench": "gpu_vision", "commit": git_commit(), "backend": args.backend,
        "machine": platform.node(), "targets": list(targets),
        "geometry": {"vision": VISION, "scale_factor": 4, "windows_per_image": windows,
                     "prompt_tokens": prompt_tokens},
        "repeats": args.repeats, "export_s": round(export_s, 1),
        "image_request_s_median": round(image, 4), "text_request_s_median": round(text, 4),
        "per_window_ms": round(1000 * (image - text) / windows, 2),
        "image_request_s": [round(x, 4) for x in image_s],
        "text_request_s": [round(x, 4) for x in text_s],
    }
    print(json.dumps(result, indent=1))
    out = args.out or ROOT / "bench" / "results" / f"gpu_vision_{args.backend}.json"
    write_json(out, result)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
