"""Training sparse models with twell: `python -m twell.train` (see --help and
twell.train.cli), token data (twell.train.data), model presets (twell.train.models), the loop
(twell.train.loop) and the per-layer sparsity figures it logs (twell.train.sparsity).

Needs torch and transformers; `tokenizers` for BPE tokenizers, tqdm for the progress bar."""
from twell.train.data import (TokenData, from_documents, from_hf_dataset, from_text_folder,
                              load_token_folder, synthetic)

__all__ = ["TokenData", "from_documents", "from_hf_dataset", "from_text_folder",
           "load_token_folder", "synthetic"]
