"""A loop built from a recipe (``tests/helpers/loops.py``), with no tuimon code in it: what `tuimon run`
watches in the generative test. Prints each optimizer step's loss as one JSON list."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.loops import LoopRecipe, train

print(json.dumps(train(LoopRecipe.from_json(sys.argv[1]))), flush=True)
