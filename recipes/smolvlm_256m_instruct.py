"""SmolVLM-256M-Instruct (Idefics3: a SigLIP tower, pixel shuffle 4 and a SmolLM2-135M
text model), from its Hugging Face safetensors folder (docs/vision.md says how to get
and export it).

Geometry and weights come from the checkpoint's config.json (model_type idefics3);
the image algorithms are the specification's selectors with SmolVLM's data:
IMAGE_PREPARATION_TILED_GLOBAL with 512-pixel tiles of 16-pixel patches, images resized
to a 2048-pixel longest edge (up to 4 x 4 tiles plus the global view: 17 windows),
LANCZOS, rescale 1/255, mean and std 0.5 (its preprocessor_config.json), and
IMAGE_LAYOUT_TILE_GRID_SPAN with its tokens: <fake_token_around_image> around each
window, <row_r_col_c> naming tiles, <global-img>, "\\n" after a tile row, "\\n\\n" before
the global view, and the chat template's <image> placeholder. 64 features a window
(1024 patches / 16), so the largest image is 17 x 64 = 1088 features in a span of about
1,160 tokens: the 1,536-token prefill chunk holds one whole.

Token ids are resolved from the checkpoint's tokenizer at export (a layout text that is
not one token fails the export, naming it). Sampling: greedy by default, as its model
card's examples generate.
"""

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.preparation.contract import tile_grid_images
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults

TILING = fe.ImageTiling(tile_pixels=512, patch_pixels=16, resize_longest_edge=2048,
                        resample=fe.IMAGE_RESAMPLE_LANCZOS, rescale=1 / 255, mean=[0.5] * 3,
                        std=[0.5] * 3)
END = "<end_of_utterance>\n"


def make_recipe(checkpoint) -> Recipe:
    text = fe.FrontendContract(
        tool_parser=fe.TOOL_PARSER_NONE, reasoning_parser=fe.REASONING_PARSER_NONE,
        prefix_boundary_rules=[fe.PrefixBoundaryRule(role=role, end_marker=END) for role in (
            fe.FRONTEND_MESSAGE_ROLE_SYSTEM, fe.FRONTEND_MESSAGE_ROLE_USER,
            fe.FRONTEND_MESSAGE_ROLE_ASSISTANT)])
    front = tile_grid_images(
        text, checkpoint.tokenizer_json, checkpoint.geometry.vocab_size, tiling=TILING,
        patches_per_feature=16, grid=4, span="<fake_token_around_image>",
        global_view="<global-img>", tile="<row_{r}_col_{c}>", row_separator="\n",
        grid_end="\n\n", placeholder="<image>")
    return Recipe(
        name="smolvlm-256m-instruct", family="llama", checkpoint=str(checkpoint.source),
        frontend=front, sampling=SamplingDefaults(temperature=0.0, max_output_tokens=512),
        capacities=Capacities(decode_batch=(1, 2, 4, 8), prefill_tokens=(64, 256, 1536),
                              prefill_rows=4, context_tokens=8192, page_tokens=16,
                              prepared_pages=2048, prepared_snapshots=32, transfer_rows=512,
                              image_windows=17, image_feature_slots=4 * 17 * 64),
        weight_dtype="bf16")
