"""transformers — run a Hugging Face transformers DeepseekV4ForCausalLM with its MoE layers on an
epmoe cluster (docs/python.md, "Engines").

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    with epmoe.Client(admin) as client:
        epmoe.integrations.transformers.attach(model, client)
        model.generate(input_ids, attention_mask=mask, max_new_tokens=16)
        epmoe.integrations.transformers.detach(model)

transformers' decoder layer calls its MoE as `self.mlp(self.post_attention_layernorm(x),
input_ids=input_ids)`; epmoe applies ffn_norm (post_attention_layernorm's weight, read from the
same checkpoint) itself, so attach replaces both: the norm by an identity and the block by an
EpmoeMoE that sends x ([B, S, H], flattened to [B*S, H] bf16) and, on hash layers, the token ids
to the cluster, and returns the whole MoE output (routed + shared experts). Decoder layer i is
epmoe layer i; MTP layers (which transformers does not build) stay reachable through the client.

The hidden states cross as bf16 without a copy when they already are a contiguous bf16 CPU
tensor (DLPack), and the answer is written by libepmoe straight into a torch tensor. Errors are
epmoe's exceptions (epmoe.errors). torch and transformers are imported by the caller, not here:
this module needs only torch, found at attach time.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from .. import _lib
from ..client import Client
from ..errors import BadRequestError

# record(layer, hidden [T, H] bf16, token_ids [T] int64 or None, out [T, H] bf16), after each call
Recorder = Callable[[int, Any, Optional[Any], Any], None]

_SAVED = "_epmoe_saved"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("epmoe.integrations.transformers needs torch (pip install torch)") from e
    return torch


def _decoder_layers(model: Any) -> List[Any]:
    """The decoder layers of a DeepseekV4ForCausalLM (or its DeepseekV4Model)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None or not all(hasattr(m, "mlp") and hasattr(m, "post_attention_layernorm") for m in layers):
        raise BadRequestError(_lib.EINVAL, f"{type(model).__name__}: not a DeepSeek V4 model (no layers[i].mlp and "
                                  "post_attention_layernorm)")
    return list(layers)


def _make_modules() -> Any:
    torch = _torch()

    class EpmoeMoE(torch.nn.Module):  # type: ignore[misc, name-defined]
        """One decoder layer's MoE block on the cluster: forward(x [B, S, H], input_ids [B, S])."""

        def __init__(self, client: Client, layer: int, is_hash: bool, record: Optional[Recorder]) -> None:
            super().__init__()
            self.client, self.layer, self.is_hash, self.record = client, layer, is_hash, record

        def forward(self, hidden_states: Any, input_ids: Any = None) -> Any:
            shape, dtype, device = hidden_states.shape, hidden_states.dtype, hidden_states.device
            h = hidden_states.detach().reshape(-1, shape[-1])
            if h.dtype != torch.bfloat16 or h.device.type != "cpu" or not h.is_contiguous():
                h = h.to(device="cpu", dtype=torch.bfloat16).contiguous()
            ids = None
            if self.is_hash:
                if input_ids is None:
                    raise BadRequestError(_lib.EINVAL, f"layer {self.layer} is hash-routed: the decoder layer passed no "
                                              "input_ids")
                ids = input_ids.detach().reshape(-1).to(device="cpu", dtype=torch.int64).contiguous()
            out = torch.empty_like(h)
            self.client.submit(self.layer, h, ids, out=out).result()
            if self.record is not None:
                self.record(self.layer, h, ids, out)
            return out.view(shape).to(device=device, dtype=dtype)

    class Identity(torch.nn.Module):  # type: ignore[misc, name-defined]
        """Stands in for post_attention_layernorm: epmoe applies ffn_norm itself."""

        def forward(self, x: Any) -> Any:
            return x

    return EpmoeMoE, Identity


def attach(model: Any, client: Client, record: Optional[Recorder] = None) -> Any:
    """Route every decoder layer's MoE of model to client's cluster (in place; returns model).
    The cluster must serve the model's shape (hidden size, main layers, hash layers): checked
    here against client.info, BadRequestError when not. record, if given, is called after
    every MoE call with what crossed (for checks such as batch invariance)."""
    EpmoeMoE, Identity = _make_modules()
    layers = _decoder_layers(model)
    info = client.info
    cfg = getattr(model, "config", None)
    H = getattr(cfg, "hidden_size", info.hidden_size)
    if H != info.hidden_size or len(layers) != info.n_main_layers:
        raise BadRequestError(_lib.EINVAL, f"the model has {len(layers)} decoder layers of hidden size {H}; the cluster "
                                  f"serves {info.n_main_layers} main layers of {info.hidden_size}")
    for i, layer in enumerate(layers):
        if hasattr(layer, _SAVED):
            raise BadRequestError(_lib.EINVAL, f"decoder layer {i} is already attached to epmoe (detach first)")
        is_hash = bool(getattr(layer.mlp, "is_hash", False))
        if is_hash != (i < info.n_hash_layers):
            raise BadRequestError(_lib.EINVAL, f"decoder layer {i}: the model says hash-routed={is_hash}, the cluster's "
                                      f"config has {info.n_hash_layers} hash layers")
        setattr(layer, _SAVED, (layer.post_attention_layernorm, layer.mlp))
        layer.post_attention_layernorm = Identity()
        layer.mlp = EpmoeMoE(client, i, is_hash, record)
    return model


def detach(model: Any) -> Any:
    """Give every attached decoder layer its own norm and MoE block back (in place)."""
    for layer in _decoder_layers(model):
        saved = layer.__dict__.get(_SAVED)
        if saved is None:
            continue
        layer.post_attention_layernorm, layer.mlp = saved
        delattr(layer, _SAVED)
    return model


def attached(model: Any) -> bool:
    """Whether any decoder layer of model is attached."""
    return any(_SAVED in layer.__dict__ for layer in _decoder_layers(model))
