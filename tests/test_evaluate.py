import csv
import io

import numpy as np
import pytest

from empo2_jax.train import evaluate


def test_summary_and_tables():
  rows = [
    evaluate.summarize("find-animal", "no memory", [100, 50, -100, 8], [1, 0, 0, 0]),
    evaluate.summarize("power-component", "no memory", [90, 100], [1, 1]),
  ]
  assert rows[0]["return_mean"] == pytest.approx(14.5)
  assert rows[0]["return_std"] == pytest.approx(np.std([100, 50, -100, 8]))
  assert rows[0]["success"] == 0.25
  full = evaluate.with_average(rows)
  assert full[-1]["task"] == "average" and full[-1]["return_mean"] == pytest.approx((14.5 + 95) / 2)
  md = evaluate.table_markdown(full)
  assert "| find-animal | no memory | 4 | 14.5 ± " in md and "| 25.0% |" in md
  back = list(csv.DictReader(io.StringIO(evaluate.table_csv(full))))
  assert [r["task"] for r in back] == ["find-animal", "power-component", "average"]
  with pytest.raises(ValueError, match="no episodes"):
    evaluate.summarize("x", "y", [], [])
