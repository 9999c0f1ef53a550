"""nanoGPT with mup, as a ptctl family: the whole registration (the model is `nanogpt_mup.model`)."""

from pydantic import Field

from studies.arch import Arch, PosInt
from studies.family import from_mup
from studies.space import Range, Space


class GPTArch(Arch):
    """What a study fixes: depth, heads (their size grows with the width) and the context."""

    context_field = "max_len"  # data.seq_len must not exceed it
    n_layers: PosInt = Field(2, description="Transformer blocks")
    n_heads: PosInt = Field(4, description="attention heads; head size = width / n_heads")
    max_len: PosInt = Field(256, description="learned positions: the longest sequence")

    def width_steps(self, base_width: int) -> dict[str, int]:
        return {"n_heads": self.n_heads}


class GPTSpace(Space):
    """lr and the three multipliers the factory takes."""

    HPARAMS = ("lr", "output_mult", "attn_mult", "init_std")
    lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=3e-2, default=3e-3), description="AdamW's base lr")
    output_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0),
                               description="MuReadout's output_mult")
    attn_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0),
                             description="attention logits: attn_mult · q·k / head size")
    init_std: Range = Field(default_factory=lambda: Range(low=0.1, high=3.0, default=1.0),
                            description="hidden weights: std = init_std / √fan_in")
    frozen: list[str] = Field(default_factory=list)


FAMILY = from_mup("nanogpt", "nanogpt_mup.model:make_model", GPTArch, GPTSpace, objective="clm",
                  coord_hp={"n_layers": 2, "n_heads": 4, "max_len": 64})
