import sys, pickle, itertools, torch, json
import os; PROBE = os.environ.get('PROBE', '<tmp>/probe')
from effrag.models.reader import WindowLogits, load_reader_checkpoint
from effrag.evaluation.metrics import answer_rule, exact_match, f1
reader = load_reader_checkpoint('checkpoints/reader-all')
ds = sys.argv[1]
names = {'ship':'checkpoints_reader-all','v2last':'runs_train_all_reader_last','s15last':'runs_train_s15-3ep-reader_last',
         's15best':'runs_train_s15-3ep-reader_best','v3last':'runs_train_v3_reader_last'}
data = {k: pickle.load(open(f'{PROBE}/{ds}_{v}.pkl','rb')) for k,v in names.items()}
rule = answer_rule(ds)
def avg(ws):
    w0 = ws[0]
    return WindowLogits(w0.document, sum(w.start for w in ws)/len(ws), sum(w.end for w in ws)/len(ws), w0.in_doc, w0.offsets,
                        sum(w.confidence for w in ws)/len(ws), sum(w.type_logits for w in ws)/len(ws))
def run(members, **dec):
    F=E=0
    rows = data[members[0]]
    for i,(q,ans,wins,_) in enumerate(rows):
        logits = [avg([data[m][i][3][j] for m in members]) for j in range(len(wins))]
        a,_ = reader.answer_windows(q, wins, logits, **dec)
        F += f1(a.answer, ans, rule); E += exact_match(a.answer, ans)
    return 100*E/len(rows), 100*F/len(rows)
for r in range(1,4):
    for combo in itertools.combinations(names, r):
        print(combo, ['%.1f'%x for x in run(list(combo))], flush=True)
