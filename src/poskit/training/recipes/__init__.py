"""One recipe per kind of run (base.py says what a recipe gives the Trainer): the language model (decoder,
masked LM, linear attention), the encoder-decoder translation model, the ViT digits classifier and the GLUE
fine-tune of a masked-LM run."""
from .base import Loop, Recipe
from .lm import LMRecipe

__all__ = ["Loop", "Recipe", "LMRecipe"]
