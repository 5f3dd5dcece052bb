"""The GPT cut into pipeline stages computes what the whole model computes."""

from __future__ import annotations

import pytest
import torch

from swarmtrain.app.models import GPT, GPTSpec
from swarmtrain.app.models.stages import build_stages, pipeline_loss, split_gpt, stage_blocks
from swarmtrain.core.errors import ConfigError

SPEC = GPTSpec(n_layer=3, n_head=2, n_embd=16, block_size=12, vocab_size=64)


def test_stage_blocks_are_contiguous_and_cover_the_model() -> None:
    assert stage_blocks(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_blocks(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    for bad in (1, 6):
        with pytest.raises(ConfigError):
            stage_blocks(5, bad)


@pytest.mark.parametrize("stages", [2, 3])
def test_split_equals_whole_model_loss_and_gradients(stages: int) -> None:
    torch.manual_seed(0)
    gpt = GPT(SPEC, seed=5)
    parts = split_gpt(gpt, stages)
    x = torch.randint(0, SPEC.vocab_size, (3, 10))
    y = torch.randint(0, SPEC.vocab_size, (3, 10))
    _, ref = gpt(x, y)
    assert ref is not None
    ref.backward()
    loss = pipeline_loss(parts, x, y)
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=0, atol=0)
    # every block's gradient, and the tied weight's as the sum of the embedding's and the head's
    for i, r in enumerate(stage_blocks(SPEC.n_layer, stages)):
        for j, g in enumerate(r):
            mine, ref_block = parts[i].blocks[j], gpt.blocks[g]
            for (n, p), (_, q) in zip(mine.named_parameters(), ref_block.named_parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, msg=n)
    tied = parts[0].wte.weight.grad + parts[-1].lm_head.weight.grad
    torch.testing.assert_close(tied, gpt.wte.weight.grad)
    torch.testing.assert_close(parts[0].wpe.weight.grad, gpt.wpe.weight.grad)
    torch.testing.assert_close(parts[-1].ln_f.weight.grad, gpt.ln_f.weight.grad)


def test_build_stages_is_deterministic_and_untied() -> None:
    a, b = build_stages(SPEC, 2, seed=3), build_stages(SPEC, 2, seed=3)
    for sa, sb in zip(a, b, strict=True):
        for (n, p), (_, q) in zip(sa.state_dict().items(), sb.state_dict().items(), strict=True):
            assert torch.equal(p, q), n
    assert a[-1].lm_head.weight.data_ptr() != a[0].wte.weight.data_ptr()
    hidden = a[0](torch.zeros(2, 5, dtype=torch.long))
    assert hidden.shape == (2, 5, SPEC.n_embd)
    assert a[1](hidden).shape == (2, 5, SPEC.vocab_size)
