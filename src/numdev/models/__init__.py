"""Pure nn.Modules: the attention module, the text tower and the diffusion transformer (no Lightning here)."""

from numdev.models.attention import Attention, AttentionCall, name_attention_layers, set_attention_backend
from numdev.models.dit import DiT
from numdev.models.text import TextFeatures, TextTower

__all__ = ["Attention", "AttentionCall", "DiT", "TextFeatures", "TextTower", "name_attention_layers", "set_attention_backend"]
