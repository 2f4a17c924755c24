"""transformers' greedy continuation of prompts longer than max_position_embeddings on the dynamic-NTK rope
fixture (tests/fixtures/llama_dynamic_rope, max_position_embeddings 8), with and without the key/value cache:
tests/fixtures/llama_dynamic_rope/generate.json. Dynamic NTK rope exists to run past the model's positions, and
transformers does (it grows the rope base for the longer sequence as the cache fills).

Usage: make_dynamic_rope_generate_fixture.py [--out tests/fixtures/llama_dynamic_rope]
Needs torch and transformers (CPU); reads the fixture's model.safetensors and writes only generate.json.
"""
import argparse
import json
import os

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41], [1, 7, 3, 60, 12, 44, 2, 90, 15, 33, 8, 71, 19]]
NEW_TOKENS = 6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "..", "tests", "fixtures", "llama_dynamic_rope"))
    args = parser.parse_args()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
    cases = []
    for prompt in PROMPTS:
        for use_cache in (True, False):
            with torch.no_grad():
                # An explicit mask: generate would otherwise mask the prompt's pad-id tokens (3).
                ids = torch.tensor([prompt])
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=use_cache, pad_token_id=3)
            cases.append({"prompt": prompt, "kv_cache": use_cache, "new_tokens": out[0, len(prompt):].tolist()})
    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "max_position_embeddings": model.config.max_position_embeddings, "cases": cases}
    with open(os.path.join(args.out, "generate.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
