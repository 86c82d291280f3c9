"""Image prompts as people give them, for vision-language models: an image (a file path,
a PIL image or an (H, W, 3) array) with a question, or a chat whose messages hold
{"type": "image", "image": ...} and {"type": "text", "text": ...} entries.

`encode_image_prompt` puts them through the model's processor and its chat template
(left-padded, as generation appends on the right); `photos` gives the images back as
PIL images, to draw maps on; `photo_preprocessing` says where the model's input lies on
each photo (the processor's resize, crop and padding), so that a map over the model's
input is drawn back on the photo (`ImagePreprocessing.to_original`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from explain.errors import InputError
from explain.preprocessing import ImagePreprocessing, read_image

__all__ = ["encode_image_prompt", "is_image_prompt", "photo_preprocessing", "photos"]


def is_image_prompt(inputs: object) -> bool:
    """Whether `inputs` is an image prompt as people give one: a {"image", "text"}
    mapping, or one chat (or several) whose messages hold {"type": "image"} entries."""
    if isinstance(inputs, Mapping):
        return "image" in inputs or "images" in inputs
    return _chats(inputs) is not None


def _chats(inputs: object) -> list[list[Mapping[str, Any]]] | None:
    """`inputs` as a list of conversations, or None when it is not one or several chats."""
    if not isinstance(inputs, Sequence) or isinstance(inputs, str) or not inputs:
        return None
    first = inputs[0]
    conversations = [inputs] if isinstance(first, Mapping) else list(inputs)
    for conversation in conversations:
        if isinstance(conversation, str | Mapping) or not isinstance(conversation, Sequence):
            return None
        if not conversation or not all(
            isinstance(m, Mapping) and {"role", "content"} <= set(m) for m in conversation
        ):
            return None
    return conversations  # type: ignore[return-value]


def photos(inputs: object) -> list[Any]:
    """The images of an image prompt, loaded as PIL images, in the order the processor
    reads them (per conversation, in message order)."""
    if isinstance(inputs, Mapping):
        given = inputs.get("images", inputs.get("image"))
        return [_load_image(i) for i in (given if isinstance(given, list | tuple) else [given])]
    found = []
    for conversation in _chats(inputs) or []:
        for message in conversation:
            if not isinstance(message["content"], str):
                found += [
                    _load_image(entry["image"])
                    for entry in message["content"]
                    if entry.get("type") == "image" and "image" in entry
                ]
    return found


def _load_image(image: object) -> Any:
    """A path, a PIL image or an (H, W, 3) array (integers in 0..255, or floats in
    [0, 1]) as a PIL RGB image."""
    import numpy as np
    from PIL import Image

    if isinstance(image, str | Path):
        return read_image(image)
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray | Tensor):
        if isinstance(image, Tensor):  # numpy has no bfloat16: floats as float32
            image = image.detach().cpu()
            image = image.float() if image.is_floating_point() else image
        array = np.asarray(image)
        if array.ndim != 3 or array.shape[-1] != 3:
            raise InputError(f"an image array must be (H, W, 3), got {array.shape}")
        return Image.fromarray(_as_bytes(array))
    raise InputError(
        f"an image is a file path, a PIL image or an (H, W, 3) array; got {type(image).__name__}"
    )


def _as_bytes(array: Any) -> Any:
    """An image array as uint8: integers taken as they are, floats in [0, 1] scaled by
    255. Other values are refused, never clipped: a photo in 0..255 given as floats
    would otherwise be read as almost white."""
    import numpy as np

    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.integer):
        if array.size and (array.min() < 0 or array.max() > 255):
            raise InputError(
                f"an image array of integers must hold 0..255, got {array.min()}..{array.max()}"
            )
        return array.astype(np.uint8)
    if not np.issubdtype(array.dtype, np.floating):
        raise InputError(
            f"an image array must hold integers in 0..255 or floats in [0, 1], got {array.dtype}"
        )
    if not np.isfinite(array).all():
        raise InputError("an image array holds NaN or infinite values")
    if array.size and (array.min() < 0.0 or array.max() > 1.0):
        low, high = float(array.min()), float(array.max())
        hint = (
            "a photo in 0..255 given as floats: divide it by 255, or give it as uint8"
            if high > 1.0 and low >= 0.0
            else "clip it to [0, 1] if that is what it means"
        )
        raise InputError(
            f"an image array of floats must hold values in [0, 1], got {low:g}..{high:g}; {hint}"
        )
    return (array * 255).round().astype(np.uint8)


def encode_image_prompt(inputs: object, processor: Any) -> dict[str, Tensor]:
    """An image prompt through `processor` (an `AutoProcessor`, with its chat template):
    input_ids, attention_mask (left-padded) and pixel_values."""
    if processor is None or not hasattr(processor, "image_processor"):
        raise InputError(
            "an image prompt needs the model's processor: Explainer(model, "
            "tokenizer=processor) (AutoProcessor.from_pretrained(...)), or pass the "
            "processor's output (input_ids, attention_mask, pixel_values)"
        )
    given: list[list[Any]]  # each text's images, apart: a processor that nests a flat list
    # as one text's images (SmolVLM's) would give them all to the first
    if isinstance(inputs, Mapping):
        images = photos(inputs)
        texts = inputs.get("text", inputs.get("question"))
        if not images:
            raise InputError("the prompt holds no image: add a {'type': 'image'} entry")
        if texts is None:
            raise InputError("an image prompt mapping needs 'image' and 'text'")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if len(images) % len(texts):
            raise InputError(
                f"{len(images)} images for {len(texts)} questions: give each question as "
                "many images (in order: the first question's, then the next one's)"
            )
        each = len(images) // len(texts)  # several images per question: one map each
        entries = [{"type": "image"}] * each
        conversations: list[list[Mapping[str, Any]]] = [
            [{"role": "user", "content": [*entries, {"type": "text", "text": t}]}] for t in texts
        ]
        given = [images[i * each : (i + 1) * each] for i in range(len(texts))]
    else:
        conversations = _chats(inputs) or []
        given = [photos(conversation) for conversation in conversations]
        if not any(given):
            raise InputError("the prompt holds no image: add a {'type': 'image'} entry")
    if getattr(processor, "chat_template", None) is not None:
        texts = [
            processor.apply_chat_template(_without_images(c), add_generation_prompt=True)
            for c in conversations
        ]
    elif not isinstance(inputs, Mapping):  # a model prompted without a template: PaliGemma
        raise InputError(
            "this processor has no chat template: give the image and the question as "
            "{'image': ..., 'text': ...}, or the processor's output"
        )
    elif isinstance(getattr(processor, "image_token", None), str):
        # the images' placeholders first, as such processors expect them (they warn else)
        texts = [processor.image_token * each + text for text in texts]
    if any(not text.strip() for text in texts):
        raise InputError("a prompt is empty: there is nothing to answer")
    encoded = processor(
        images=given, text=texts, padding=True, padding_side="left", return_tensors="pt"
    )
    return dict(encoded)


def _without_images(conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A conversation for the chat template: image entries keep their place, not their
    pixels (the template writes the placeholder; the processor reads the images)."""
    return [
        {
            **message,
            "content": message["content"]
            if isinstance(message["content"], str)
            else [
                {"type": "image"} if entry.get("type") == "image" else dict(entry)
                for entry in message["content"]
            ],
        }
        for message in conversation
    ]


def photo_preprocessing(processor: Any) -> ImagePreprocessing:
    """Where the model's input lies on a photo, from a vision-language processor's image
    processor: its resize and centre crop (`ImagePreprocessing.from_processor`), and
    LLaVA's `do_pad`, which pads the photo to a square before resizing (so the whole
    photo is seen, letterboxed: the "longer" fit).

    Qwen2-VL's processor resizes each photo to whole blocks of `patch_size * merge_size`
    pixels near its own size, cropping nothing: the model's input is the whole photo,
    squashed by less than a block, so a map over it is stretched over the photo (the
    "exact" fit; `size` is then one block, as the input's size varies per photo).
    Idefics3's and SmolVLM's resize each photo to whole tiles (`max_image_size`) near its
    own shape, cropping nothing, and split it into them: the tiles' map spans the whole
    photo alike."""
    images = getattr(processor, "image_processor", processor)
    block = _whole_photo_block(images)
    if block is not None:
        return ImagePreprocessing(
            size=(block, block),
            mean=tuple(float(m) for m in images.image_mean),
            std=tuple(float(s) for s in images.image_std),
            fit="exact",
        )
    found = ImagePreprocessing.from_processor(images)
    if getattr(images, "do_pad", False):
        found = dataclasses.replace(found, resize=found.size, fit="longer")
    return found


def _whole_photo_block(images: Any) -> int | None:
    """The side of the blocks an image processor resizes each whole photo to a number of,
    near its own size, or None: Qwen2-VL's and Qwen2.5-VL's merged blocks of patches
    (`merge_size`, and pixel counts as sizes), Idefics3's and SmolVLM's tiles (the
    photo's longer side resized, then each side up to whole `max_image_size` tiles)."""
    size = getattr(images, "size", None) or {}
    if hasattr(images, "merge_size") and "longest_edge" in size and "height" not in size:
        return int(images.patch_size) * int(images.merge_size)
    tile = getattr(images, "max_image_size", None)
    if isinstance(tile, Mapping) and "longest_edge" in tile:
        return int(tile["longest_edge"])
    return None
