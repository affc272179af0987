import sys, pickle, torch
import os; PROBE = os.environ.get('PROBE', '<tmp>/probe')
from effrag.models.reader import load_reader_checkpoint
from effrag.evaluation.metrics import answer_rule, exact_match, f1
ds = sys.argv[1]
reader = load_reader_checkpoint('checkpoints/reader-all')
A = pickle.load(open(f'{PROBE}/{ds}_checkpoints_reader-all.pkl','rb'))
B = pickle.load(open(f'{PROBE}/{ds}_checkpoints_reader-all_rev.pkl','rb'))
rule = answer_rule(ds)
res = {'fwd':0,'rev':0,'maxconf':0,'maxscore':0,'oracle':0}
for (q,ans,wa,la),(_,_,wb,lb) in zip(A,B):
    a,_ = reader.answer_windows(q, wa, la); b,_ = reader.answer_windows(q, wb, lb)
    fa, fb = f1(a.answer, ans, rule), f1(b.answer, ans, rule)
    res['fwd']+=fa; res['rev']+=fb; res['oracle']+=max(fa,fb)
    res['maxconf'] += fa if a.confidence>=b.confidence else fb
    res['maxscore'] += fa if a.span_score>=b.span_score else fb
print({k: round(100*v/len(A),2) for k,v in res.items()})
