#!/usr/bin/env python3
"""make_hf_configs.py — regenerate the config.json files in this directory with Hugging Face
transformers (README.md beside this file gives the command and what each file tests).

Every file except deepseek-v41/ and mkmodel-fp4|fp8/ is written by transformers' own
save_pretrained: a DeepseekV4Config built here, or the AutoConfig round trip of the config
`epmoectl mkmodel` wrote (kept beside it as mkmodel-fp4|fp8/).
The sizes are mkmodel's defaults (H 256, I 128, 16 experts, top-6, 4 layers, 1 hash layer, 1 MTP
layer, vocab 1000), so each config can stand beside an mkmodel checkpoint in a test.

usage: make_hf_configs.py EPMOECTL [OUTDIR]   (OUTDIR defaults to this script's directory)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import transformers
from transformers import AutoConfig, DeepseekV4Config, FineGrainedFP8Config

SIZES = dict(hidden_size=256, moe_intermediate_size=128, n_routed_experts=16,
             num_experts_per_tok=6, num_hidden_layers=4, vocab_size=1000,
             num_nextn_predict_layers=1)


def save(cfg, out, name):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    cfg.save_pretrained(d)
    print(f"{name}/config.json")
    return os.path.join(d, "config.json")


def edit(path, **fields):
    """Add fields to a saved file, for cases transformers itself does not write (README says
    which)."""
    with open(path) as f:
        j = json.load(f)
    j.update(fields)
    with open(path, "w") as f:
        json.dump(j, f, indent=2, sort_keys=True)
        f.write("\n")


def roundtrip(epmoectl, dtype, out):
    """mkmodel-DTYPE/: the config.json epmoe wrote; mkmodel-DTYPE-autoconfig/: the same after
    AutoConfig.from_pretrained + save_pretrained."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([epmoectl, "mkmodel", "--out", tmp, "--expert-dtype", dtype], check=True,
                       stdout=subprocess.DEVNULL)
        mine = os.path.join(out, f"mkmodel-{dtype}")
        os.makedirs(mine, exist_ok=True)
        shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(mine, "config.json"))
        print(f"mkmodel-{dtype}/config.json (epmoectl mkmodel)")
        cfg = AutoConfig.from_pretrained(tmp)
    return save(cfg, out, f"mkmodel-{dtype}-autoconfig")


def v41(out):
    """Hand-written: transformers 5.23 has no deepseek_v41. The shape of a V4.1 config as the
    issue describes it: model_type deepseek_v41, the text model's fields under text_config,
    384 routed experts, no hash layers, expert_dtype inside quantization_config."""
    d = os.path.join(out, "deepseek-v41")
    os.makedirs(d, exist_ok=True)
    j = {
        "architectures": ["DeepseekV41ForConditionalGeneration"],
        "model_type": "deepseek_v41",
        "text_config": {
            "model_type": "deepseek_v41_text",
            "hidden_size": 7168, "moe_intermediate_size": 3072, "n_routed_experts": 384,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "num_hidden_layers": 61,
            "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sqrtsoftplus",
            "swiglu_limit": 10.0, "rms_norm_eps": 1e-06, "vocab_size": 129280,
            "hidden_act": "silu",
        },
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "weight_block_size": [128, 128], "expert_dtype": "fp4"},
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(j, f, indent=2, sort_keys=True)
        f.write("\n")
    print("deepseek-v41/config.json (hand-written)")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    epmoectl = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(__file__))
    print(f"transformers {transformers.__version__}")
    hash1 = dict(num_hash_layers=1)  # folded into mlp_layer_types by DeepseekV4Config

    # accepted
    save(DeepseekV4Config(**SIZES, **hash1,
                          quantization_config=FineGrainedFP8Config(expert_dtype="fp8")),
         out, "v4-fp8")
    save(DeepseekV4Config(**SIZES, **hash1, quantization_config=FineGrainedFP8Config(
        expert_dtype="fp4", scale_fmt="ue8m0")), out, "v4-fp4-ue8m0")
    roundtrip(epmoectl, "fp4", out)
    roundtrip(epmoectl, "fp8", out)

    # refused
    save(DeepseekV4Config(**SIZES, **hash1, expert_dtype="fp4",
                          quantization_config=FineGrainedFP8Config(expert_dtype="fp8")),
         out, "dtype-conflict")
    save(DeepseekV4Config(**SIZES, mlp_layer_types=["moe", "hash_moe", "moe", "moe"],
                          quantization_config=FineGrainedFP8Config(expert_dtype="fp8")),
         out, "hash-after-moe")
    p = save(DeepseekV4Config(**SIZES, **hash1,
                              quantization_config=FineGrainedFP8Config(expert_dtype="fp8")),
             out, "hash-conflict")
    edit(p, num_hash_layers=2)
    save(DeepseekV4Config(**SIZES, **hash1,
                          quantization_config=FineGrainedFP8Config(expert_dtype="fp4")),
         out, "fp4-scale-float")
    save(DeepseekV4Config(**SIZES, **hash1, norm_topk_prob=False, quantization_config=
                          FineGrainedFP8Config(expert_dtype="fp4", scale_fmt="ue8m0")),
         out, "norm-topk-false")
    v41(out)


if __name__ == "__main__":
    main()
