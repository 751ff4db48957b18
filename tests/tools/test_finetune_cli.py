"""``python -m torch_adreno finetune``: LoRA on a causal LM (the text task) and
MobileNetV2 transfer learning (the images task), through a replayed TrainingStep.

The end-to-end text run is a config JSON of a one-layer GPT-2 on PoCL: its loss falls, its steps
after the second were replays, and the adapter it saved loads in peft with the weights it trained.
The images task end to end and the text task with a target are slow (a MobileNetV2 compile on PoCL
takes tens of seconds); unmarked, their models are checked as built."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_adreno
from torch_adreno.cli import finetune, finetune_images, finetune_text, main
from torch_adreno.data import digits_rgb_split, digits_split
from torch_adreno.data.text import ByteTokenizer, load_corpus
from torch_adreno.models import mobilenet_v2

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

#: A one-layer GPT-2 small enough for PoCL in CI (random weights, byte vocabulary).
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2, "n_positions": 32, "vocab_size": 256,
             "bos_token_id": None, "eos_token_id": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


class RecordedSteps:
    """Every TrainingStep the command makes (its class replaced by a recording subclass)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: object) -> None:
        self.steps: list[object] = []
        recorded = self.steps
        base = module.TrainingStep  # type: ignore[attr-defined]

        class Recording(base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)
                recorded.append(self)

        monkeypatch.setattr(module, "TrainingStep", Recording)


def _config_file(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "tiny_gpt2.json"
    path.write_text(json.dumps({**TINY_GPT2, **changes}))
    return path


def _lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name.replace(".default", ""): p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


@pytest.mark.device
def test_text_task_trains_replays_and_saves_an_adapter_peft_loads(tmp_path, monkeypatch, capsys):
    steps = RecordedSteps(monkeypatch, finetune_text)
    trained: list[nn.Module] = []
    get_peft_model = peft.get_peft_model

    def keep(*args, **kwargs):
        trained.append(get_peft_model(*args, **kwargs))
        initial.update(_lora_state(trained[-1]))
        return trained[-1]

    initial: dict[str, torch.Tensor] = {}
    monkeypatch.setattr(peft, "get_peft_model", keep)
    out = tmp_path / "adapter"
    code = main(["finetune", "--model", str(_config_file(tmp_path)), "--steps", "30", "--seq", "16", "--batch", "4",
                 "--lr", "0.05", "--lora-modules", "c_attn", "c_fc", "--eval-batches", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err

    # The steps after the second replayed the recorded launch list (the first compiles, the second captures).
    (step,) = steps.steps
    assert step.replayed_steps == 28  # type: ignore[attr-defined]
    assert "28 of 30 steps replayed" in captured.out
    # The progress bar counted tokens and showed their rate and the loss.
    assert re.search(r"tok/s, loss=\d+\.\d+", captured.err), captured.err[-2000:]
    first, last = map(float, re.search(r"training loss: ([\d.]+) -> ([\d.]+)", captured.out).groups())
    before, after = map(float, re.search(r"held-out loss: ([\d.]+) -> ([\d.]+)", captured.out).groups())
    assert last < first and after < before - 0.02, captured.out  # held out: the same batches before and after

    # peft loads the adapter onto the saved base; its weights are the trained ones, which training changed.
    (model,) = trained
    assert set((out / "base").iterdir()) >= {out / "base" / "config.json", out / "base" / "model.safetensors"}
    base = transformers.AutoModelForCausalLM.from_pretrained(out / "base")
    loaded = peft.PeftModel.from_pretrained(base, out)
    saved, ours = _lora_state(loaded), _lora_state(model)
    assert saved.keys() == ours.keys() == initial.keys() and any("c_fc" in name for name in saved)
    for name, value in ours.items():
        assert torch.equal(saved[name], value), name
    assert any(not torch.equal(initial[name], value) for name, value in ours.items() if "lora_B" in name)
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    for name, value in loaded.named_parameters():
        if name in frozen:
            assert torch.equal(value, frozen[name]), name
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["replayed_steps"] == 28 and len(summary["losses"]) == 30
    assert summary["base_model"] == str((out / "base").resolve())


def _settings(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    finetune.register(parser.add_subparsers())
    return finetune.settings_for(parser.parse_args(["finetune", *argv]))


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one-line error ``finetune argv`` ends in, with exit status 2 (from argparse or the command)."""
    try:
        code = main(["finetune", *argv])
    except SystemExit as exit_info:
        code = exit_info.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "error: " in err, err
    return err


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "0"], r"--steps: expected an integer >= 1, got '0'"),
    (["--device", "nosuchdevice"], r"no OpenCL device matches 'nosuchdevice'"),
    (["--seq", "-1"], r"--seq: expected an integer >= 1, got '-1'"),
    (["--lr", "nan"], r"--lr: expected a number > 0, got 'nan'"),
    (["--target", "adreno999"], r"--target: invalid choice: 'adreno999'"),
    (["--task", "audio"], r"--task: invalid choice: 'audio'"),
    (["--image-size", "4"], r"--image-size: expected an image side in pixels >= 8, got '4'"),
    (["--task", "images", "--seq", "8", "--rank", "2"], r"--rank, --seq apply to another task than --task images"),
    (["--train-last", "1"], r"--train-last applies to another task than --task text"),
    (["--model", "gpt2"], r"--model 'gpt2' is not a directory, a \.json config file or a built-in shape "
                          r"\(tiny-random, .*nothing is downloaded"),
    (["--seq", "300"], r"--seq 300 is longer than the model's 256 positions"),
    (["--tokenizer", "model"], r"--tokenizer model needs a checkpoint directory"),
    (["--lora-modules", "nosuch"], r"no LoRA adapters for this model .*nosuch.*--lora-modules"),
    (["--task", "images", "--train-last", "20"], r"--train-last 20: MobileNetV2 has 19 feature blocks; pass 0\.\.19"),
    (["--task", "images", "--batch", "5000"], r"--batch 5000 is larger than the 1438 training digits"),
])
def test_bad_arguments_are_refused_with_what_to_do(capsys, tmp_path, argv, message):
    assert re.search(message, _refused(capsys, *argv, "--out", str(tmp_path / "out")))


def test_bad_model_files_are_refused_by_name(capsys, tmp_path):
    no_type = tmp_path / "no_type.json"
    no_type.write_text(json.dumps({"n_layer": 1}))
    assert 'a config JSON needs a "model_type"' in _refused(capsys, "--model", str(no_type))
    small = _config_file(tmp_path, vocab_size=100)
    assert re.search(r"token id \d+ of the bytes tokenizer is outside the model's vocabulary of 100.*bytes need 256",
                     _refused(capsys, "--model", str(small)))
    empty = tmp_path / "empty_checkpoint"
    empty.mkdir()
    assert "not a causal LM checkpoint transformers can load" in _refused(capsys, "--model", str(empty))
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be")
    assert "fewer than --seq 64" in _refused(capsys, "--text", str(short))
    weights = tmp_path / "weights.pt"
    torch.save({"features.0.0.weight": torch.zeros(1)}, weights)
    assert re.search(r"--weights .*not the state_dict of a torchvision MobileNetV2",
                     _refused(capsys, "--task", "images", "--weights", str(weights)))


def test_the_text_task_without_peft_names_the_pip_command(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    assert re.search(r"needs transformers and peft, and peft cannot be imported .*pip install 'transformers>=5\.24' "
                     r"'peft>=0\.21'", _refused(capsys, "--steps", "1"))


def test_a_checkpoint_directory_brings_its_weights_and_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    text = load_corpus().decode()[:20_000]
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator([text], tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    checkpoint = tmp_path / "checkpoint"
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe)
    tokenizer.save_pretrained(checkpoint)
    config = transformers.GPT2Config(**{k: v for k, v in TINY_GPT2.items() if k != "model_type"} | {"vocab_size": 300})
    transformers.GPT2LMHeadModel(config).save_pretrained(checkpoint)
    source = tmp_path / "text.txt"
    source.write_text(text)

    base = finetune_text.load_base_model(str(checkpoint), 0, transformers)
    assert base.checkpoint == checkpoint.resolve() and isinstance(base.model, transformers.GPT2LMHeadModel)
    tokens = finetune_text.tokenize(_settings(["--model", str(checkpoint), "--text", str(source), "--seq", "16"]),
                                    base, transformers)
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert torch.cat([tokens.train, tokens.held_out]).tolist() == expected
    assert len(tokens.held_out) == int(len(expected) * finetune_text.HELD_OUT_SHARE)
    assert len(expected) < len(text)  # merged tokens, not bytes
    forced = finetune_text.tokenize(_settings(["--model", str(checkpoint), "--text", str(source),
                                               "--seq", "16", "--tokenizer", "bytes"]), base, transformers)
    assert torch.cat([forced.train, forced.held_out]).tolist() == list(text.encode())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_base_dtype_stores_the_frozen_base_in_16_bits_and_adapters_in_float32(dtype):
    config = transformers.GPT2Config(**{k: v for k, v in TINY_GPT2.items() if k != "model_type"})
    model = finetune_text.add_adapters(transformers.GPT2LMHeadModel(config), _settings(["--rank", "4"]), peft)
    ids = ByteTokenizer().encode("Now is the winter of our").view(1, -1)
    reference = finetune_text.causal_lm_loss(model, ids).item()
    torch_adreno.freeze(model, getattr(torch, dtype))
    params = dict(model.named_parameters())
    assert params["base_model.model.transformer.h.0.attn.c_attn.base_layer.weight"].dtype == getattr(torch, dtype)
    assert all(p.dtype == torch.float32 for n, p in params.items() if "lora_" in n)
    with pytest.raises(RuntimeError, match=r"torch\.autocast"):
        finetune_text.causal_lm_loss(model, ids)  # 16-bit weights are read under autocast only
    loss = finetune_text.loss_function(dtype)(model, ids).item()
    assert loss == pytest.approx(reference, rel=2e-2)


def test_builtin_shapes_are_gpt2_124m_and_qwen2_5_0_5b():
    def count(name: str) -> tuple[int, int]:
        model_type, values = finetune_text.BUILTIN_SHAPES[name]
        config = finetune_text.make_config(transformers, model_type, dict(values), name)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters()), model.get_input_embeddings().weight.numel()

    assert count("gpt2-124m-random")[0] == 124_439_808  # GPT-2 small, lm_head tied to the embedding
    total, embedding = count("qwen2.5-0.5b-random")
    # Qwen2.5-0.5B's model card: 0.49B parameters, 0.36B of them not the (tied) embedding.
    assert round(total / 1e9, 2) == 0.49 and round((total - embedding) / 1e9, 2) == 0.36
    assert embedding == 151_936 * 896


def test_the_corpus_is_the_documented_public_domain_text():
    import hashlib

    corpus = load_corpus()
    assert len(corpus) == 299_868 and corpus.isascii()
    assert hashlib.sha256(corpus).hexdigest() == "7bce277f2f9d6c2c5ebb6307101f7b5a6fe4ada24dd87971bd874d4bed8d503b"
    assert corpus.startswith(b"First Citizen:\nBefore we proceed any further, hear me speak.")
    tokenizer = ByteTokenizer()
    assert tokenizer.decode(tokenizer.encode("Now is the winter of our discontent")) == \
        "Now is the winter of our discontent"


def test_images_model_freezes_all_but_the_classifier_and_the_last_blocks(tmp_path):
    frozen_only = finetune_images.build_model(_settings(["--task", "images", "--width-mult", "0.25"]))
    trainable = {n for n, p in frozen_only.named_parameters() if p.requires_grad}
    assert trainable == {"classifier.1.weight", "classifier.1.bias"}
    assert frozen_only.classifier[1].out_features == 10 and frozen_only.classifier.training
    assert not any(m.training for m in frozen_only.features.modules())
    # A random backbone's statistics, estimated, so that its features do not vanish (1e-10 with the initial ones).
    images = digits_rgb_split(8, seed=0)[0][:16]
    with torch.no_grad():
        vanishing = frozen_only.features(images).std().item()
        assert finetune_images.estimate_batch_norm_statistics(frozen_only, images, 16) == 52
        features = frozen_only.features(images)
    assert vanishing < 1e-6 and features.std().item() > 0.1
    assert not any(m.training for m in frozen_only.features.modules()) and frozen_only.classifier.training

    last_two = finetune_images.build_model(_settings(["--task", "images", "--width-mult", "0.25",
                                                      "--train-last", "2"]))
    trainable = {n.split(".")[1] for n, p in last_two.named_parameters() if p.requires_grad and n.startswith("features")}
    assert trainable == {"17", "18"} and last_two.features[17].training

    weights = tmp_path / "mobilenet_v2.pth"
    torch.save(mobilenet_v2(width_mult=0.25).state_dict(), weights)
    pretrained = finetune_images.build_model(_settings(["--task", "images", "--width-mult", "0.25",
                                                        "--weights", str(weights)]))
    assert torch.equal(pretrained.features[0][0].weight, torch.load(weights)["features.0.0.weight"])
    assert not any(m.training for m in pretrained.features.modules())  # trained statistics kept
    assert pretrained.classifier[1].out_features == 10


def test_digits_as_rgb_images_are_split_as_the_digits_are():
    x, y, x_test, y_test = digits_rgb_split(16, seed=3)
    assert x.shape == (1438, 3, 16, 16) and x_test.shape == (359, 3, 16, 16)
    assert torch.equal(y, digits_split(3)[1]) and torch.equal(y_test, digits_split(3)[3])
    # ImageNet's normalisation: a blank pixel is (0 - mean) / std in each channel.
    assert torch.allclose(x[:, :, 0, 0].amin(0), torch.tensor([-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225]))


@pytest.mark.device
@pytest.mark.slow
def test_images_task_trains_the_classifier_on_the_device(tmp_path, monkeypatch, capsys):
    steps = RecordedSteps(monkeypatch, finetune_images)
    out = tmp_path / "images"
    code = main(["finetune", "--task", "images", "--steps", "30", "--batch", "16", "--width-mult", "0.25",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    (step,) = steps.steps
    assert step.replayed_steps == 28  # type: ignore[attr-defined]
    assert re.search(r"img/s, loss=", captured.err)
    # The same held-out digits before and after (a random backbone's features carry little of the
    # digits: the loss falls slowly, the accuracy stays near chance; --weights is transfer learning proper).
    before, after = map(float, re.search(r"held-out loss: ([\d.]+) -> ([\d.]+), accuracy [\d.]+%", captured.out).groups())
    assert after < before, captured.out
    accuracy = float(re.search(r"accuracy ([\d.]+)%", captured.out).group(1))
    assert (accuracy < 50) == ("why so low: the backbone's weights are random" in captured.out), captured.out
    assert "from torch_adreno.models import mobilenet_v2" in captured.out
    state = torch.load(out / finetune_images.STATE_FILE)
    initial = finetune_images.build_model(_settings(["--task", "images", "--width-mult", "0.25"])).state_dict()
    assert not torch.equal(state["classifier.1.weight"], initial["classifier.1.weight"])
    assert all(torch.equal(state[k], v) for k, v in initial.items() if k.endswith("weight") and "features" in k)


@pytest.mark.device
@pytest.mark.slow
def test_text_task_compiled_for_adreno740_from_a_checkpoint_with_a_float16_base(tmp_path, capsys):
    checkpoint = tmp_path / "checkpoint"
    config = transformers.GPT2Config(**{k: v for k, v in TINY_GPT2.items() if k != "model_type"})
    transformers.GPT2LMHeadModel(config).save_pretrained(checkpoint)
    out = tmp_path / "adapter"
    code = main(["finetune", "--model", str(checkpoint), "--tokenizer", "bytes", "--target", "adreno740",
                 "--base-dtype", "float16", "--steps", "12", "--seq", "16", "--batch", "4", "--lr", "0.03", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "compiled for adreno740" in captured.out and "10 of 12 steps replayed" in captured.out
    assert re.search(r"base weights: \d+ frozen tensors stored as float16", captured.out)
    # The replayed step's memory, held to the target's limits (adreno740: 1 GiB per allocation).
    assert re.search(r"device memory of the replayed step: [\d,]+ bytes .* of target adreno740's", captured.out), captured.out
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(checkpoint.resolve())
    peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(checkpoint), out)


def test_a_low_accuracy_says_why():
    random = finetune_images.why_accuracy_is_low(_settings(["--task", "images", "--steps", "30"]))
    assert "random (no --weights)" in random and "30 steps" in random and "--weights FILE" in random
    trained = finetune_images.why_accuracy_is_low(_settings(["--task", "images", "--weights", "w.pth", "--steps", "5"]))
    assert "5 steps" in trained and "random" not in trained
