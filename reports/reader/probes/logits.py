import sys, torch, pickle, time
from pathlib import Path
import os; PROBE = os.environ.get('PROBE', '<tmp>/probe'); os.makedirs(PROBE, exist_ok=True)
from effrag.data import load_questions
from effrag.models.reader import passage_text, load_reader_checkpoint
torch.set_num_threads(2)
ds = sys.argv[1]; reverse = 'rev' in sys.argv[3:]
ck = sys.argv[2]
reader = load_reader_checkpoint(ck).eval()
qs = [q for q in load_questions(f"{os.environ.get('DATA', '../shared/data')}/{ds}/dev.jsonl") if q.gold]
rows = []
t0=time.time()
for q in qs:
    ps = [passage_text(p.title, p.text) for p in q.gold]
    if reverse: ps = ps[::-1]
    w, l = reader.window_logits(q.question, ps)
    rows.append((q.question, q.answers, w, l))
name = ck.replace('/', '_') + ('_rev' if reverse else '')
pickle.dump(rows, open(f'{PROBE}/{ds}_{name}.pkl', 'wb'))
print(ds, ck, reverse, time.time()-t0, flush=True)
