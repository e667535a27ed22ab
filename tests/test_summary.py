"""tools/summary.py's lines from metric files' contents (in-process)."""

from tools import summary

FOUND = {
    "metrics/dataset.json": {"train": {"rows": 207865, "skipped": 12}, "eval": {"rows": 2000, "skipped": 0}},
    "metrics/token_lengths.json": {"train": {"rows": 207865, "median_tokens": 1093}},
    "metrics/convert_check.json": {
        "conversion": {"passed": True, "kl_max": 4.4e-3, "kl_mean": 4.9e-5, "top1_agreement": 1.0}
    },
    "dvclive/metrics.json": {
        "run": {
            "steps": 1000,
            "first_step_loss": 2.5,
            "final_loss": 1.25,
            "final_eval_loss": 1.3,
            "median_tokens_per_sec_per_device": 5123.4,
            "mfu": 0.41,
        }
    },
    "metrics/eval.json": {
        "eval": {
            "base_loss": 1.9,
            "fine_tuned_loss": 1.3,
            "base_perplexity": 6.69,
            "fine_tuned_perplexity": 3.67,
            "target_tokens": 812345,
        }
    },
    "metrics/export_check.json": {
        "export": {"passed": False, "kl_max": 4.5e-5, "kl_mean": 2e-6, "top1_agreement": 1.0}
    },
    "metrics/gguf_check.json": {
        "gguf": {
            "f16": {
                "file": "model-F16.gguf",
                "bytes": 7_760_000_000,
                "passed": True,
                "kl_max": 4e-13,
                "kl_mean": 1.6e-13,
                "top1_agreement": 1.0,
            },
            "q8_0": {
                "file": "model-Q8_0.gguf",
                "bytes": 4_130_000_000,
                "passed": True,
                "kl_max": 0.024,
                "kl_mean": 1e-3,
                "top1_agreement": 0.991,
            },
        }
    },
    "logs/stage_times.json": {"evaluate": 95.0, "train": 3725.0, "dataset": 40.2},
}
LIMITS = {
    "convert_in": {"check": {"max_kl": 1e-2, "max_mean_kl": 2e-4}},
    "convert_out": {"check": {"max_kl": 3e-5, "max_mean_kl": 5e-6}},
    # q8_0 is no longer in gguf.check (params.yaml changed since the run): its line has no limits
    "gguf": {"check": {"f16": {"max_kl": 1e-5, "max_mean_kl": 1e-6}}},
}


def test_a_whole_run():
    assert summary.lines(FOUND, LIMITS) == [
        "data        207,865 training conversations (12 bad rows skipped), median 1,093 tokens; 2,000 held out",
        "conversion  passed: max KL 0.0044 (limit 0.01), mean KL 4.9e-05 (limit 0.0002), top-1 agreement 1.0000",
        "training    1000 steps, loss 2.500 -> 1.250, held-out 1.300; 5,123 tokens/s per device, MFU 41.0%",
        "held-out    loss 1.900 (base) -> 1.300 (fine-tuned), perplexity 6.69 -> 3.67, 812,345 target tokens",
        "export      FAILED: max KL 4.5e-05 (limit 3e-05), mean KL 2e-06 (limit 5e-06), top-1 agreement 1.0000",
        "gguf f16    passed: max KL 4e-13 (limit 1e-05), mean KL 1.6e-13 (limit 1e-06), top-1 agreement 1.0000; "
        "model-F16.gguf, 7,760.0 MB",
        "gguf q8_0   passed: max KL 0.024, mean KL 0.001, top-1 agreement 0.9910; model-Q8_0.gguf, 4,130.0 MB",
        "time        dataset 40 s, train 1:02:05, evaluate 1:35; 1:04:20 in all (each stage's last run)",
    ]


def test_stages_not_run_yet_are_left_out():
    assert summary.lines({"metrics/dataset.json": FOUND["metrics/dataset.json"]}, None) == [
        "data        207,865 training conversations (12 bad rows skipped); 2,000 held out"
    ]
    assert summary.lines({}, None) == []


def test_a_run_with_preference_tuning():
    found = {
        "dvclive-preference/metrics.json": {
            "run": {
                "algorithm": "dpo",
                "steps": 477,
                "first_step_loss": 0.693,
                "final_loss": 0.41,
                "reward_accuracy": 0.7,
            }
        },
        "metrics/eval.json": {
            "eval": {
                **FOUND["metrics/eval.json"]["eval"],
                "pairs": 2000,
                "sft_preference_accuracy": 0.55,
                "preference_tuned_preference_accuracy": 0.68,
                "reward_accuracy": 0.71,
                "preference_tuned_loss": 1.32,
            }
        },
    }
    assert summary.lines(found, None) == [
        "preference  dpo, 477 steps, loss 0.693 -> 0.410, reward accuracy 0.700 (training)",
        "held-out    loss 1.900 (base) -> 1.300 (fine-tuned), perplexity 6.69 -> 3.67, 812,345 target tokens",
        "pairs       2000 held out: chosen preferred 0.550 (SFT) -> 0.680 (preference-tuned), reward accuracy 0.710; "
        "loss 1.320 (preference-tuned)",
    ]
