"""Fill a Hugging Face cache with tiny models under real hub names, to try the hub specs
of the `explain` command line without network (the models are random: the pictures show
that everything runs, not what a trained model looks at).

    python scripts/fill_hub_cache.py /tmp/hub
    export HF_HUB_CACHE=/tmp/hub HF_HUB_OFFLINE=1
    photo=examples/images/chelsea.jpg
    explain image $photo --model vit_tiny_patch16_224.augreg_in21k_ft_in1k --out maps/
    explain image $photo --model hf-hub:timm/deit_tiny_patch16_224.fb_in1k --out maps/
    explain image $photo --model google/vit-base-patch16-224 --out maps/
    explain text "a warm, funny film" --html maps/text.html \\
        --model distilbert/distilbert-base-uncased-finetuned-sst-2-english

The cache is laid out exactly as downloads leave it (explain.testing.fill_hub_cache, the
helper the tests use), so the commands take the same code path as with real downloads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from explain.loading.hub import quiet_transformers
from explain.testing import HUB_SPECS, fill_hub_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path, help="the cache folder (then HF_HUB_CACHE=CACHE)")
    args = parser.parse_args()
    with quiet_transformers():  # no "Writing model shards" bars for tiny random models
        fill_hub_cache(args.cache)
    print(f"cached in {args.cache}:")
    for kind, spec in HUB_SPECS.items():
        print(f"  {kind:9s} --model {spec}")
    print(f"now: export HF_HUB_CACHE={args.cache} HF_HUB_OFFLINE=1")


if __name__ == "__main__":
    main()
