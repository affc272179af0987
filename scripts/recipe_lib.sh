# Shell helpers shared by the recipe's scripts (train_efficientrag.sh, train_set_ranker.sh); sourced, with $BIN set.
same_config() {  # $1 $2: loop config files whose options (but set_ranker_top) are equal
  "$BIN/python" -c 'import json,sys; c=[{k: v for k, v in json.load(open(f))["config"].items() if k != "set_ranker_top"} for f in sys.argv[1:]]; sys.exit(c[0] != c[1])' "$1" "$2"
}
ranker_of() {  # $1: a loop config file -> the ranker folder it reads with
  "$BIN/python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("ranker") or "ranker")' "$1"
}
