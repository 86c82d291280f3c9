"""A photo's regions as citation sources (explain.cite.regions, explain.cite.image): a
region given in the user's photo lands on exactly the patches the model saw, through a
processor that resizes and crops (tiny LLaVA), one that resizes and tiles (tiny
Idefics3) and one that resizes to whole blocks (tiny Qwen2-VL), read off the
processor's own pixels; a region's score is its patches' relevance; the region check
against the answer's log-probability computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explain import Explainer, ExplainError, InputError, OptionError
from explain.cite.check import check_scores, spearman
from explain.cite.image import RegionCitation, cite_image
from explain.cite.regions import (
    fill,
    fill_colour,
    grid_regions,
    patch_shares,
    photo_patches,
    read_regions,
    region_from,
    slic_count,
    slic_regions,
)
from explain.loading.preprocessing import photo_preprocessing
from explain.testing import ModelState
from explain.testing.tiny_vlm import (
    tiny_idefics3_processor,
    tiny_llava,
    tiny_llava_processor,
)

RED = np.array([255, 0, 0], dtype=np.uint8)


def _grey(size) -> np.ndarray:
    return np.full((*size, 3), 128, dtype=np.uint8)


def _red_patches(image: torch.Tensor, patch: int) -> torch.Tensor:
    """(gh * gw,) bool: the patches of the model's input image (3, H, W) in [0, 1] whose
    centre pixel is red, as the processor made it."""
    centre = image[:, patch // 2 :: patch, patch // 2 :: patch]
    red = (centre[0] > 0.9) & (centre[1] < 0.1) & (centre[2] < 0.1)
    return red.flatten()


@pytest.fixture(scope="module")
def llava():
    model = tiny_llava("clip").double()
    return Explainer(model, tokenizer=tiny_llava_processor("clip"))


def test_grid_cells_cover_the_photo_once():
    cells = grid_regions((40, 61), 3, 4)
    assert [c.name for c in cells[:5]] == ["r1c1", "r1c2", "r1c3", "r1c4", "r2c1"]
    counts = np.sum([c.mask for c in cells], axis=0)
    assert (counts == 1).all()
    assert cells[5].box == (15, 13, 30, 27)  # edges at round(i * 40 / 3), round(j * 61 / 4)


def test_a_box_through_resize_and_crop_is_the_patches_the_model_saw():
    # tiny LLaVA's processor: a 40 x 60 photo -> 32 x 48 (shorter side 32), centre 32 x 32
    # cropped (resized columns 8..40, the photo's 10..50); a patch of 8 input pixels is
    # 10 photo pixels. The box's pixels, painted red, are the processor's red patches.
    processor = tiny_llava_processor("clip")
    geometry = photo_preprocessing(processor)
    size, grid = (40, 60), (4, 4)
    for box in ([20, 10, 30, 20], [10, 0, 30, 20], [40, 30, 50, 40]):
        region = region_from({"box": box}, size)
        shares = patch_shares([region], geometry, size, grid)[0]
        photo = _grey(size)
        photo[region.mask] = RED
        pixels = processor.image_processor(images=photo, return_tensors="pt")["pixel_values"][0]
        seen = _red_patches(pixels * 0.5 + 0.5, 8)
        assert set(shares.unique().tolist()) == {0.0, 1.0}
        assert torch.equal(shares == 1, seen), box
    # cropped away: the photo's columns 0..10 land on no patch
    cropped = region_from({"box": [0, 0, 10, 40]}, size)
    assert patch_shares([cropped], geometry, size, grid).abs().sum() == 0


def test_a_box_through_resize_and_tiles_is_the_patches_the_model_saw():
    # tiny Idefics3's processor: a 48 x 80 photo -> 64 x 96, 2 x 3 tiles of 32 pixels,
    # 4 x 4 patches of 8 each: the photo's grid is 8 x 12 patches, a patch 6 photo rows
    # by 20/3 photo columns. The box rows 6..18, columns 20..40 is patches 1-2 x 3-5.
    processor = tiny_idefics3_processor("idefics3")
    images = processor.image_processor
    geometry = photo_preprocessing(processor)
    size, grid = (48, 80), (8, 12)
    region = region_from({"box": [20, 6, 40, 18]}, size)
    shares = patch_shares([region], geometry, size, grid)[0]
    photo = _grey(size)
    photo[region.mask] = RED
    out = images(images=[[photo]], return_row_col_info=True, return_tensors="pt")
    assert (out["rows"], out["cols"]) == ([[2]], [[3]])
    tiles = out["pixel_values"][0, :6].reshape(2, 3, 3, 32, 32).double()
    pixels = tiles.permute(2, 0, 3, 1, 4).reshape(3, 64, 96)
    mean, std = torch.tensor(images.image_mean), torch.tensor(images.image_std)
    seen = _red_patches(pixels * std[:, None, None] + mean[:, None, None], 8)
    expected = torch.zeros(grid, dtype=torch.bool)
    expected[1:3, 3:6] = True
    assert torch.equal(seen, expected.flatten())
    assert torch.equal(shares == 1, seen) and set(shares.unique().tolist()) == {0.0, 1.0}
    # the grid's cells share out every patch: the shares of each patch sum to 1
    cells = patch_shares(grid_regions(size), geometry, size, grid)
    torch.testing.assert_close(cells.sum(dim=0), torch.ones(96, dtype=torch.float64))


def test_a_box_through_qwen2_vl_blocks_is_the_patches_the_model_saw():
    # tiny Qwen2-VL's processor: a 48 x 80 photo -> 32 x 48 (whole 16-pixel blocks, no
    # crop), 8-pixel patches: a 4 x 6 grid, a patch 12 photo rows by 40/3 photo columns.
    # The box rows 12..36, columns 13..53 is patches 1-2 x 1-3, read off the processor's
    # flattened patches put back in place (2 x 2 blocks, two frames).
    from explain.testing.tiny_vlm import tiny_qwen2_vl_processor

    processor = tiny_qwen2_vl_processor()
    images = processor.image_processor
    images.image_mean, images.image_std = [0.0] * 3, [1.0] * 3
    size, grid = (48, 80), (4, 6)
    region = region_from({"box": [13, 12, 53, 36]}, size)
    shares = patch_shares([region], photo_preprocessing(processor), size, grid)[0]
    photo = _grey(size)
    photo[region.mask] = RED
    out = images(images=photo, return_tensors="pt")
    assert out["image_grid_thw"][0].tolist() == [1, 4, 6]
    patches = out["pixel_values"].reshape(2, 3, 2, 2, 3, 2, 8, 8)[:, :, :, :, :, 0]
    pixels = patches.permute(4, 0, 2, 5, 1, 3, 6).reshape(3, 32, 48).double()
    seen = _red_patches(pixels, 8)
    expected = torch.zeros(grid, dtype=torch.bool)
    expected[1:3, 1:4] = True
    assert torch.equal(seen, expected.flatten())
    assert torch.equal(shares == 1, seen) and set(shares.unique().tolist()) == {0.0, 1.0}


def test_a_region_scores_its_patches_relevance(llava):
    photo = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
    regions = [{"name": "one patch", "box": [20, 10, 30, 20]}, {"box": [10, 0, 30, 20]}]
    before = ModelState.capture(llava.adapter.model)
    cited = cite_image(llava, photo, "w12 w13", "w14 w15", regions=regions, check=False)
    assert before.differences(ModelState.capture(llava.adapter.model)) == []
    maps = cited.patch_relevance
    assert maps.shape == (2, 4, 4) and cited.region_relevance.shape == (2, 2)
    torch.testing.assert_close(cited.region_relevance[:, 0], maps[:, 1, 1])
    torch.testing.assert_close(cited.region_relevance[:, 1], maps[:, :2, :2].sum(dim=(1, 2)))
    torch.testing.assert_close(cited.scores, cited.region_relevance.sum(dim=0))
    assert [r.name for r in cited.regions] == ["one patch", "region 2"]
    # the grid covers every patch the model saw: its scores add up to the whole map
    grid = cite_image(llava, photo, "w12 w13", "w14 w15", check=False)
    assert len(grid.regions) == 9
    torch.testing.assert_close(grid.scores.sum(), maps.sum())


def _log_p(llava, photo, question, answer_ids):
    """log p(answer) for the photo, written out: the processor, the model's own forward."""
    processor = llava.tokenizer
    encoded = processor(
        images=[photo],
        text=[
            processor.apply_chat_template(
                [
                    {
                        "role": "user",
                        "content": [{"type": "image"}, {"type": "text", "text": question}],
                    }
                ],
                add_generation_prompt=True,
            )
        ],
        return_tensors="pt",
    )
    ids = torch.cat([encoded["input_ids"], answer_ids[None]], dim=1)
    with torch.no_grad():
        logits = (
            llava.adapter.model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=encoded["pixel_values"].double(),
            )
            .logits[0]
            .double()
        )
    start = encoded["input_ids"].shape[1]
    rows = logits[start - 1 : start - 1 + answer_ids.shape[0]].log_softmax(dim=-1)
    return float(rows.gather(1, answer_ids[:, None]).sum())


def test_the_region_check_is_the_answer_without_the_top_regions_by_hand(llava):
    photo = (np.random.default_rng(1).random((40, 60, 3)) * 255).astype(np.uint8)
    cited = cite_image(llava, photo, "w12 w13", "w14 w15", lds=6, seed=3)
    check = cited.check
    assert check is not None and [d.k for d in check.drops] == [1, 3, 5]
    colour = photo.reshape(-1, 3).mean(axis=0).round()
    assert f"({int(colour[0])}, {int(colour[1])}, {int(colour[2])})" in check.ablation
    whole = _log_p(llava, photo, "w12 w13", cited.answer_ids)
    assert check.full == pytest.approx(whole, abs=1e-9)
    ranked = cited.ranked()
    for drop in check.drops:
        removed = [index in ranked[: drop.k] for index in range(9)]
        edited = photo.copy()
        for index, gone in enumerate(removed):
            if gone:
                edited[cited.regions[index].mask] = colour.astype(np.uint8)
        without = _log_p(llava, edited, "w12 w13", cited.answer_ids)
        assert drop.top == pytest.approx(whole - without, abs=1e-9)
        assert drop.random_std >= 0
    # k = 1 against random regions: the 9 regions are few, so each is removed once (the
    # exact baseline): their drops' mean and population standard deviation
    singles = []
    for region in cited.regions:
        edited = photo.copy()
        edited[region.mask] = colour.astype(np.uint8)
        singles.append(whole - _log_p(llava, edited, "w12 w13", cited.answer_ids))
    first = check.drops[0]
    assert first.exact
    assert first.random == pytest.approx(float(np.mean(singles)), abs=1e-9)
    assert first.random_std == pytest.approx(float(np.std(singles)), abs=1e-9)
    assert check.lds_ablations == 6 and check.lds is not None and -1 <= check.lds <= 1


def test_check_scores_reads_any_targets():
    # a target that is exactly the sum of the kept sources' weights: the top-k drop is the
    # top k weights, the random drop k random ones', and the LDS of the weights is 1
    weights = torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0, 0.1, 4.0])
    calls = []

    def targets(keep):
        calls.append(keep.shape)
        return keep.double() @ weights.double()

    check = check_scores(weights, targets, lds=32, seed=0, ablation="by weight")
    # k = 1: all 7 single sources once (the exact baseline); k = 3, 5: 16 random sets each
    assert len(calls) == 1 and calls[0] == (1 + 3 + 7 + 2 * 16 + 32, 7)
    assert [d.exact for d in check.drops] == [True, False, False]
    assert check.drops[0].random == pytest.approx(float(weights.mean()))
    assert check.full == pytest.approx(float(weights.sum()))
    assert [d.top for d in check.drops] == pytest.approx([5.0, 12.0, 15.0])
    assert all(d.random < d.top for d in check.drops)
    assert check.lds == pytest.approx(1.0) and check.ablation == "by weight"
    assert spearman(weights, -weights) == pytest.approx(-1.0)


def test_fill_is_the_mean_colour_of_the_photo():
    photo = np.zeros((4, 4, 3), dtype=np.uint8)
    photo[:2] = [200, 100, 51]
    colour = fill_colour(photo)
    assert colour.tolist() == [100, 50, 26]  # 25.5 rounds to even
    cells = grid_regions((4, 4), 2, 2)
    out = fill(photo, cells, [True, False, False, True], colour)
    assert (out[:2, :2] == colour).all() and (out[2:, 2:] == colour).all()
    assert (out[:2, 2:] == photo[:2, 2:]).all() and (out[2:, :2] == 0).all()
    with pytest.raises(OptionError, match="fill must be one of mean"):
        fill_colour(photo, "blur")


def test_regions_from_json_boxes_and_masks(tmp_path):
    from PIL import Image

    mask = np.zeros((10, 12), dtype=np.uint8)
    mask[2:5, 3:9] = 255
    Image.fromarray(mask).save(tmp_path / "m.png")
    path = tmp_path / "regions.json"
    path.write_text(
        '[{"name": "left", "box": [0, 0, 6, 10]}, {"name": "blob", "mask": "m.png"},'
        ' {"mask": ' + str((mask > 0).astype(int).tolist()) + "}]"
    )
    left, blob, third = read_regions(path, (10, 12))
    assert left.mask[:, :6].all() and not left.mask[:, 6:].any()
    assert blob.box == (3, 2, 9, 5) and blob.mask.sum() == 18
    assert third.name == "region 3" and np.array_equal(third.mask, blob.mask)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"box": [0, 0, 13, 5]}, "does not lie inside the 12 x 10 photo"),
        ({"box": [4, 0, 4, 5]}, "left < right"),
        ({"box": [0, 0, 1.5, 5]}, "a box is"),
        ({"mask": [[1, 0]]}, "a mask is 10 x 12 values of 0 or 1"),
        ({"mask": np.zeros((10, 12))}, "its mask holds no pixel"),
        ({"box": [0, 0, 1, 1], "mask": []}, "a 'box' or a 'mask'"),
        ({"box": [0, 0, 1, 1], "name": ""}, "name must be a text"),
    ],
)
def test_bad_regions_are_refused(entry, message):
    with pytest.raises(InputError, match=message):
        region_from(entry, (10, 12))


def test_what_cite_image_refuses(llava, tmp_path):
    photo = _grey((40, 60))
    with pytest.raises(OptionError, match="a grid's rows"):
        cite_image(llava, photo, "w12", "w14", grid=(0, 3))
    with pytest.raises(OptionError, match="one cell is the whole photo"):
        cite_image(llava, photo, "w12", "w14", grid=(1, 1))
    with pytest.raises(InputError, match="names must differ"):
        cite_image(llava, photo, "w12", "w14", regions=[{"box": [0, 0, 5, 5], "name": "a"}] * 2)
    with pytest.raises(InputError, match="question is empty"):
        cite_image(llava, photo, " ", "w14")
    with pytest.raises(OptionError, match="lds is part of the check"):
        cite_image(llava, photo, "w12", "w14", check=False, lds=4)
    from explain.testing.tiny_lm import tiny_causal_lm, tiny_tokenizer

    text = Explainer(tiny_causal_lm("llama"), tokenizer=tiny_tokenizer())
    with pytest.raises(InputError, match="vision-language model with its processor"):
        cite_image(text, photo, "w12", "w14")


def test_a_region_citation_saves_and_loads(llava, tmp_path):
    photo = (np.random.default_rng(2).random((40, 60, 3)) * 255).astype(np.uint8)
    cited = cite_image(llava, photo, "w12 w13", "w14", lds=4)
    for suffix in ("json", "npz"):
        path = tmp_path / f"cite.{suffix}"
        cited.save(path)
        back = RegionCitation.load(path)
        assert [r.name for r in back.regions] == [r.name for r in cited.regions]
        pairs = zip(back.regions, cited.regions, strict=True)
        assert all(np.array_equal(a.mask, b.mask) for a, b in pairs)
        torch.testing.assert_close(back.scores, cited.scores)
        assert back.check == cited.check and back.answer == "w14"
    listed = cited.to_dict()
    assert listed["regions"][0]["box"] == [0, 0, 20, 13] and "masks" not in listed


def test_cite_with_an_image_cites_its_regions(llava):
    from explain.cite import cite

    photo = (np.random.default_rng(4).random((40, 60, 3)) * 255).astype(np.uint8)
    by_cite = cite(llava, None, "w12 w13", "w14", image=photo, grid=(2, 2), check=False)
    direct = cite_image(llava, photo, "w12 w13", "w14", grid=(2, 2), check=False)
    assert isinstance(by_cite, RegionCitation) and len(by_cite.regions) == 4
    torch.testing.assert_close(by_cite.scores, direct.scores)
    with pytest.raises(OptionError, match="citing a photo takes no foil"):
        cite(llava, "a text", "w12", "w14", image=photo, foil="w13")


def _blocks_photo() -> np.ndarray:
    """A 40 x 60 photo of six flat colour blocks with a little noise: superpixels have
    edges to find."""
    rng = np.random.default_rng(5)
    colours = rng.integers(0, 256, size=(2, 3, 3))
    photo = np.kron(colours, np.ones((20, 20, 1))) + rng.normal(0, 4, size=(40, 60, 3))
    return photo.clip(0, 255).astype(np.uint8)


def test_superpixels_cover_the_photo_once_and_are_the_same_each_time():
    photo = _blocks_photo()
    regions = slic_regions(photo, 12)
    assert 6 <= len(regions) <= 18  # SLIC's seeds on a grid: about the count asked
    assert [r.name for r in regions] == [f"superpixel {i}" for i in range(1, len(regions) + 1)]
    assert (np.sum([r.mask for r in regions], axis=0) == 1).all()
    for region in regions:
        rows, cols = np.nonzero(region.mask)
        assert region.box == (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
    again = slic_regions(photo, 12)
    assert all(np.array_equal(a.mask, b.mask) for a, b in zip(regions, again, strict=True))
    # a block's edge is a superpixel's edge: no superpixel straddles the blocks' borders
    blocks = np.kron(np.arange(6).reshape(2, 3), np.ones((20, 20), dtype=int))
    assert all(len(np.unique(blocks[r.mask])) == 1 for r in regions)


def test_bad_superpixel_counts_are_refused():
    assert slic_count("slic:12") == 12 and slic_count("regions.json") is None
    with pytest.raises(OptionError, match="slic:N"):
        slic_count("slic:many")
    with pytest.raises(OptionError, match="at least 2"):
        slic_regions(_blocks_photo(), 1)


def test_superpixels_without_scikit_image_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "skimage.segmentation", None)  # as if not installed
    with pytest.raises(ExplainError, match=r"explain-transformers\[superpixels\]"):
        slic_regions(_blocks_photo(), 12)


def test_cite_with_superpixels_scores_each_its_patches_relevance(llava):
    photo = _blocks_photo()
    cited = cite_image(llava, photo, "w12 w13", "w14 w15", regions="slic:8", lds=4)
    expected = slic_regions(photo, 8)
    assert [r.name for r in cited.regions] == [r.name for r in expected]
    assert cited.settings["regions"] == "superpixels" and "grid" not in cited.settings
    # by hand, pixel by pixel: each photo pixel carries its patch's relevance over the
    # number of photo pixels landing on that patch (cropped pixels carry none)
    maps = cited.patch_relevance.flatten(1)
    landing = photo_patches(photo_preprocessing(llava.tokenizer), (40, 60), (4, 4))
    seen = landing >= 0
    counts = torch.bincount(landing[seen], minlength=16).double()
    per_pixel = torch.zeros(maps.shape[0], 40, 60, dtype=torch.float64)
    per_pixel[:, seen] = maps[:, landing[seen]] / counts[landing[seen]]
    by_hand = torch.stack(
        [per_pixel[:, torch.from_numpy(r.mask)].sum(dim=1) for r in expected], dim=1
    )
    torch.testing.assert_close(cited.region_relevance, by_hand)
    torch.testing.assert_close(cited.scores.sum(), maps.sum())  # they share out the map
    assert cited.check is not None and cited.check.lds_ablations == 4
