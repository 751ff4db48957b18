"""The trainers people use, wired the documented way (``model.compile(backend="adreno")`` before
handing the model over), against the same trainer running eagerly.

* Hugging Face ``Trainer`` with a peft LoRA model (tiny random GPT-2, and Qwen2 with 4 query and 2
  key-value heads): its defaults (``adamw_torch_fused``), gradient accumulation 2, warmup 3 and
  cosine decay, 12 optimizer steps; the logged losses within 2e-3 of eager's, and falling.
* PyTorch Lightning: a ``LightningModule`` with fused AdamW, a cosine schedule and gradient
  accumulation.

Accelerate's ``TrainingArguments(torch_compile_backend=...)`` takes only the backends of its own
enum, so the model is compiled before the Trainer gets it (docs/guide/training-loops.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import torch_adreno

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.device

VOCAB, SEQ = 48, 8


class _Sequences(Dataset):
    """Eight random sequences, repeated: a model that learns them shows a falling loss quickly."""

    def __init__(self, repeats: int = 6) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (8, SEQ), generator=generator).repeat(repeats, 1)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def _lora_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=16,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model, targets = transformers.GPT2LMHeadModel(config), ["c_attn"]
    else:
        config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                          max_position_embeddings=16)
        model, targets = transformers.Qwen2ForCausalLM(config), ["q_proj", "v_proj"]
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False)
    return peft.get_peft_model(model, lora)


class _LoggedLosses(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def _train_with_trainer(kind: str, options: dict[str, Any] | None, tmp_path: Any) -> tuple[list[float], Any]:
    model = _lora_model(kind)
    if options is not None:
        model.compile(backend="adreno", options=options)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("compiled" if options is not None else "eager")), per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=12, learning_rate=5e-2, warmup_steps=3, lr_scheduler_type="cosine",
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True, seed=0)
    logged = _LoggedLosses()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Sequences(), callbacks=[logged])
    with torch_adreno.profile() as prof:
        trainer.train()
    return logged.losses, (prof, args)


@pytest.mark.parametrize("kind, options", [("gpt2", {"zero_copy": False}), ("qwen2", {})],
                         ids=["gpt2-zero_copy=False", "qwen2"])
def test_hugging_face_trainer_with_lora_follows_eager(kind: str, options: dict[str, Any], tmp_path: Any) -> None:
    eager, (_, args) = _train_with_trainer(kind, None, tmp_path)
    ours, (prof, _) = _train_with_trainer(kind, options, tmp_path)
    assert "fused" in str(args.optim).lower(), args.optim  # the Trainer's default optimizer
    assert prof.kernel_launches > 0 and prof.graph_runs, "the backend ran nothing"
    assert len(ours) == len(eager) == 12
    assert max(abs(a - b) for a, b in zip(ours, eager, strict=True)) <= 2e-3, (ours, eager)
    assert sum(ours[-3:]) < sum(ours[:3]) - 0.05, f"the loss did not fall: {ours}"


def test_lightning_module_follows_eager() -> None:
    lightning = pytest.importorskip("lightning")

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            self.losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=2e-2, fused=True)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, 12)}

    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 16, generator=generator), torch.randint(0, 4, (64,), generator=generator))

    def fit(compiled: bool) -> tuple[list[float], Any]:
        module = Classifier()
        if compiled:
            module.compile(backend="adreno", options={"zero_copy": False})
        trainer = lightning.Trainer(max_steps=12, accumulate_grad_batches=2, accelerator="cpu", logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        with torch_adreno.profile() as prof:
            trainer.fit(module, DataLoader(data, batch_size=8))
        return module.losses, prof

    eager, _ = fit(False)
    ours, prof = fit(True)
    assert prof.kernel_launches > 0
    assert len(ours) == len(eager) == 24
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    assert sum(ours[-4:]) < sum(ours[:4])
