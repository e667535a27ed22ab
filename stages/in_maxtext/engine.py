"""MaxText's own inference engine, driven for the pipeline: answers (greedy or sampled) to many
prompts at once, and log-likelihoods, from the pipeline's MaxText checkpoints, in pure JAX (no
torch, no vLLM): what scores a model on the chip it was trained on.

    engine = Engine(maxtext_flags, slots=64, max_prompt=512, max_answer=1280)
    engine.load("models/base-maxtext/0/items")
    answers = engine.generate(prompts, max_new_tokens=[...], stop_ids={1, 106})
    scores = engine.loglikelihoods([(context_ids, continuation_ids), ...])

Generation runs on MaxText's MaxEngine (maxtext/inference/maxengine): `prefill` one prompt
into a KV cache, `insert` it into a free slot of the decode batch, `generate` one token for
every slot at once. The loop here is MaxText's OfflineEngine's (continuous batching: a slot
freed by a finished answer takes the next prompt), written out in the main thread, with what
that class lacks and the pipeline needs: a token cap and stop tokens per prompt, and sampling
settings per call. OfflineEngine itself is not used: its detokenisation thread calls int() on a
one-element array, which NumPy 2.5 (the CPU lock's) refuses, and its SafeThread then SIGKILLs
the whole process; and a failure in the main thread leaves that thread keeping the process
alive (both measured, ../shared notes, 2026-12-07).

Log-likelihoods come from a batched forward pass of the same model (train mode: no cache) on
the same parameters, rows right-padded, each row's log-probability of its continuation and
whether greedy decoding would have produced it, as lm-eval's `loglikelihood` asks.

The seam (`jetstream_stand_ins_as_pytrees`): MaxText 0.2.5 takes JetStream's engine API where it
is installed and stand-ins otherwise (the locks have no JetStream: PyPI's only google-jetstream
is 0.2.2, from 2024). The stand-in `ResultTokens` is a plain class, and MaxEngine's jitted
prefill and generate return one, which JAX refuses as an output. Registering it as a pytree
(`data` and `log_prob` its leaves, the index tuples static) is all it takes; nothing of MaxText
is edited.

On a TPU a prompt is padded to a multiple of 128 tokens: the splash attention kernel of the
prefill takes no other length ("bkv_compute=174 must be a multiple of 128", measured); padding
also bounds the prefill programs to compile to one per length bucket.
"""

import dataclasses
import math
import time
from collections import deque

import numpy as np

PAD_MULTIPLE_TPU = 128  # the prefill's sequence length on a TPU (splash attention's block)
# What one scoring batch's logits may take (batch x length x vocabulary, float32): Gemma 3's
# 262,144 words make 1 GiB per 1,024 tokens of a row, so a batch of long rows is a few rows.
SCORING_LOGITS_BYTES = 2 << 30
STEPS_PER_FETCH = 8  # decode steps dispatched before their tokens are read back: the host
# reads once per 8 steps, the chip never waits for it; a finished answer costs at most 7
# steps of its slot


def jetstream_stand_ins_as_pytrees() -> None:
    """Registers MaxText's JetStream stand-in `ResultTokens` (where JetStream is absent) as a
    JAX pytree, so that MaxEngine's jitted prefill and generate can return it."""
    import jax
    from maxtext.inference.maxengine import maxengine

    cls = maxengine.engine_api.ResultTokens
    if not getattr(maxengine.engine_api, "_IS_STUB", False) or getattr(cls, "_registered_by_pipeline", False):
        return  # the real JetStream's class is a registered dataclass already

    def flatten(r):
        return (r.data, r.log_prob), (r.tokens_idx, r.valid_idx, r.length_idx, r.samples_per_slot)

    def unflatten(aux, leaves):
        tokens_idx, valid_idx, length_idx, samples_per_slot = aux
        return cls(
            data=leaves[0],
            log_prob=leaves[1],
            tokens_idx=tokens_idx,
            valid_idx=valid_idx,
            length_idx=length_idx,
            samples_per_slot=samples_per_slot,
        )

    jax.tree_util.register_pytree_node(cls, flatten, unflatten)
    cls._registered_by_pipeline = True


_ATTENTION_CALL: list[tuple] = []  # (the AR cache's lengths or None, the query positions) of the call being traced


def sliding_window_by_position() -> None:
    """Masks a sliding-window layer's decode step by the tokens' positions, not their slots.

    MaxText 0.2.5's decode step (one query token, model_mode autoregressive) attends over two
    caches, the prompt's (prefill) and the answer's (a ring of slots), and masks each for a
    sliding window as if the query were the cache's last slot: `next_pos = kv_seq_len - 1` in
    AttentionOp.generate_attention_mask. With a prefill cache longer than the window, a local
    layer then sees none of a short prompt (its tokens sit in the cache's first slots), and
    with an answer cache longer than the window, none of the answer's first tokens. Gemma 3's
    local layers (5 of every 6; a 512-token window on the 270M, 64 on the tiny model) decoded
    nonsense beside transformers' answers from the first token after the prompt (measured on
    the tiny model, 2026-12-07: right with a 64-token prefill cache, wrong with 256).
    Here, in a decode step of a sliding-window layer, each cached key's position is known:
    slot i of the prefill cache holds position i; in the answer's ring the newest slot holds
    the query's own position (its key is written before it attends), the one before it one
    less. The window is applied to those; MaxText's segment mask (which slots hold this
    sequence's tokens) is kept as it is. Prefill and training masks are MaxText's own."""
    import jax.numpy as jnp
    from maxtext.common.common_types import DECODING_ACTIVE_SEQUENCE_INDICATOR, MODEL_MODE_AUTOREGRESSIVE
    from maxtext.layers import attention_op

    op = attention_op.AttentionOp
    if getattr(op, "_window_by_position", False):
        return
    apply_attention, generate_mask = op.apply_attention, op.generate_attention_mask

    def apply(self, *args, **kwargs):
        _ATTENTION_CALL.append((kwargs.get("lengths"), kwargs.get("segment_positions")))
        try:
            return apply_attention(self, *args, **kwargs)
        finally:
            _ATTENTION_CALL.pop()

    def mask(self, query, key, decoder_segment_ids, model_mode, *args, **kwargs):
        kind = kwargs.get("attention_type") or self.attention_type
        positions = _ATTENTION_CALL[-1][1] if _ATTENTION_CALL else None
        if (
            model_mode != MODEL_MODE_AUTOREGRESSIVE
            or kind != attention_op.AttentionType.LOCAL_SLIDING
            or query.shape[1] != 1
            or positions is None
            or decoder_segment_ids is None
        ):
            return generate_mask(self, query, key, decoder_segment_ids, model_mode, *args, **kwargs)
        segments = generate_mask(
            self,
            query,
            key,
            decoder_segment_ids,
            model_mode,
            *args,
            **{**kwargs, "attention_type": attention_op.AttentionType.GLOBAL},
        )
        lengths = _ATTENTION_CALL[-1][0]
        slots = jnp.arange(key.shape[1])[None, :]
        query_at = positions.reshape(positions.shape[0], -1)[:, :1]  # [batch, 1]
        if lengths is None:  # the prompt's cache: slot i holds position i
            key_at = jnp.broadcast_to(slots, (query_at.shape[0], key.shape[1]))
        else:  # the answer's ring: the newest valid slot (the end of the valid arc) holds the query's position
            valid = decoder_segment_ids == DECODING_ACTIVE_SEQUENCE_INDICATOR
            newest = jnp.argmax(valid & ~jnp.roll(valid, -1, axis=1), axis=1)[:, None]
            key_at = query_at - jnp.mod(newest - slots, key.shape[1])
        distance = query_at - key_at
        window = (distance >= 0) & (distance < self.sliding_window_size)
        return jnp.where(window[:, None, None, None, :], segments, attention_op.DEFAULT_MASK_VALUE)

    op.apply_attention, op.generate_attention_mask = apply, mask
    op._window_by_position = True


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How each next token is chosen: greedy (temperature 0), or drawn at `temperature`."""

    temperature: float = 0.0
    seed: int = 0

    @property
    def algorithm(self) -> str:
        return "greedy" if self.temperature == 0 else "weighted"


@dataclasses.dataclass
class Generated:
    """One answer: its tokens (the stop token, where one came, not included) and whether it
    stopped by itself (a stop token) rather than at its cap."""

    tokens: list[int]
    ended: bool


@dataclasses.dataclass
class Timing:
    """Where an engine's time went, for the stage's report."""

    load_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    score_s: float = 0.0
    prompts: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    scored_rows: int = 0

    def add(self, other: "Timing") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def bucket(length: int, multiple: int, largest: int) -> int:
    """The padded length of a sequence: the next power of two from `multiple` (at least), so
    few lengths are compiled, never over `largest`."""
    padded = multiple
    while padded < length:
        padded *= 2
    return min(padded, largest)


class Engine:
    """One MaxEngine and its compiled programs, and the parameters of one checkpoint at a time
    (`load` replaces them: a second model reuses every program compiled for the first)."""

    def __init__(self, maxtext_flags: list[str], slots: int, max_prompt: int, max_answer: int):
        import jax

        jetstream_stand_ins_as_pytrees()
        sliding_window_by_position()
        self.on_tpu = jax.default_backend() == "tpu"
        self.multiple = PAD_MULTIPLE_TPU if self.on_tpu else 8
        self.max_prompt = -(-max_prompt // self.multiple) * self.multiple
        self.max_answer = max_answer
        # The cache holds the prompt, the answer, and the steps a finished answer may run on
        # before the host sees it finished.
        self.flags = [
            *maxtext_flags,
            f"per_device_batch_size={slots}",
            f"max_prefill_predict_length={self.max_prompt}",
            f"max_target_length={self.max_prompt + max_answer + STEPS_PER_FETCH}",
        ]
        self.slots = slots * jax.device_count()
        self.engine = None  # made with the first checkpoint (MaxEngine loads its parameters itself)
        self.config = None
        self.params = None
        self._scorer = None
        self.timing = Timing()

    def _config(self, checkpoint: str):
        from maxtext.configs import pyconfig

        return pyconfig.initialize_pydantic(["engine", *self.flags, f"load_parameters_path={checkpoint}"])

    def load(self, checkpoint: str) -> None:
        """The parameters of `checkpoint` (MaxText's Orbax parameters), in place of the last
        ones (freed first: one model's weights on the chip at a time). The first load builds
        the engine; later ones reuse every program it compiled."""
        import jax
        from flax import nnx
        from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE
        from maxtext.inference.maxengine import maxengine
        from maxtext.utils import model_creation_utils

        started = time.monotonic()
        if self.engine is None:
            self.config = self._config(checkpoint)
            self.engine = maxengine.MaxEngine(self.config)
            self.params = self.engine.load_params()
        else:
            for leaf in jax.tree.leaves(self.params):
                leaf.delete()
            self.params = None
            with self.engine.mesh:
                model = model_creation_utils.from_pretrained(
                    self._config(checkpoint), mesh=self.engine.mesh, model_mode=MODEL_MODE_AUTOREGRESSIVE
                )
            _, params, _ = nnx.split(model, nnx.Param, ...)
            del model
            self.params = jax.device_put(params, jax.tree.map(lambda a: a.sharding, self.engine.abstract_params))
        jax.block_until_ready(self.params)
        self.timing.load_s += time.monotonic() - started

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_ids: set[int],
        sampling: Sampling = Sampling(),
    ) -> list[Generated]:
        """Each prompt's answer, at most its `max_new_tokens`, ending at a token of `stop_ids`.
        Prompts longer than the engine's prompt length keep their end (as lm-eval's backends
        truncate: on the left)."""
        import jax
        import jax.numpy as jnp

        if any(n > self.max_answer for n in max_new_tokens):
            raise ValueError(f"an answer cap of {max(max_new_tokens)} tokens exceeds the engine's {self.max_answer}")
        timing = Timing(prompts=len(prompts))
        rng = jax.random.PRNGKey(sampling.seed)
        decode_state = self.engine.init_decode_state()
        # Longest first: the prefill lengths compile early, and the last, short answers finish together.
        pending = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
        free = list(range(self.slots))[::-1]
        active: dict[int, int] = {}  # slot -> prompt index
        said: list[list[int]] = [[] for _ in prompts]
        done: list[bool | None] = [None] * len(prompts)  # None: running; True: stopped; False: cut at its cap
        first_tokens: dict[int, jax.Array] = {}  # slot -> its prompt's first token, not yet read
        while pending or active:
            started = time.monotonic()
            while pending and free:
                i = pending.popleft()
                slot = free.pop()
                ids = prompts[i][-self.max_prompt :]
                padded = bucket(len(ids), self.multiple, self.max_prompt)
                tokens = np.zeros(padded, np.int32)
                tokens[: len(ids)] = ids
                rng, key = jax.random.split(rng)
                prefix, first = self.engine.prefill(
                    params=self.params,
                    padded_tokens=jnp.asarray(tokens),
                    true_length=len(ids),
                    rng=key,
                    algorithm=sampling.algorithm,
                    temperature=sampling.temperature,
                )
                decode_state = self.engine.insert(prefix, decode_state, slot)
                first_tokens[slot] = first.data[0, 0]
                active[slot] = i
                timing.prompt_tokens += len(ids)
            timing.prefill_s += time.monotonic() - started
            started = time.monotonic()
            steps = []
            for _ in range(STEPS_PER_FETCH):
                rng, key = jax.random.split(rng)
                decode_state, result = self.engine.generate(
                    self.params, decode_state, rng=key, algorithm=sampling.algorithm, temperature=sampling.temperature
                )
                steps.append(result.data[:, 0])
            fetched = jax.device_get((first_tokens, jnp.stack(steps)))
            firsts, tokens = fetched[0], np.asarray(fetched[1])
            first_tokens = {}
            timing.decode_steps += STEPS_PER_FETCH
            for slot, i in list(active.items()):
                new = ([int(firsts[slot])] if slot in firsts else []) + [int(t) for t in tokens[:, slot]]
                for t in new:
                    if t in stop_ids:
                        done[i] = True
                        break
                    said[i].append(t)
                    if len(said[i]) >= max_new_tokens[i]:
                        done[i] = False
                        break
                if done[i] is not None:
                    del active[slot]
                    free.append(slot)
            timing.decode_s += time.monotonic() - started
        timing.generated_tokens = sum(map(len, said))
        self.timing.add(timing)
        return [Generated(tokens=s, ended=bool(d)) for s, d in zip(said, done, strict=True)]

    def _score_fn(self):
        """The jitted forward of a batch of right-padded rows: per row, the sum of its
        targets' log-probabilities and whether each target was the argmax."""
        if self._scorer is not None:
            return self._scorer
        import jax
        import jax.numpy as jnp
        from flax import nnx
        from flax.core.spmd import logical_axis_rules
        from maxtext.common.common_types import MODEL_MODE_TRAIN
        from maxtext.utils import model_creation_utils

        config, mesh = self.config, self.engine.mesh
        create = model_creation_utils.get_nnx_create_model_fn(config, mesh=mesh, model_mode=MODEL_MODE_TRAIN)
        with logical_axis_rules(config.logical_axis_rules):
            abstract = nnx.eval_shape(create)
        graphdef, _, _ = nnx.split(abstract, nnx.Param, ...)

        @jax.jit
        def rest_state():  # the model's other variables (its RNG streams): no parameter is computed
            return nnx.split(create(), nnx.Param, ...)[2]

        with mesh, logical_axis_rules(config.logical_axis_rules):
            rest = rest_state()

        @jax.jit
        def score(params, tokens, positions, segments, targets, weights):
            with logical_axis_rules(config.logical_axis_rules):
                model = nnx.merge(graphdef, params, rest, copy=True)
                logits = model(
                    tokens, positions, decoder_segment_ids=segments, enable_dropout=False, model_mode=MODEL_MODE_TRAIN
                )
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            chosen = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
            greedy = jnp.argmax(logits, axis=-1) == targets
            return (chosen * weights).sum(-1), jnp.where(weights > 0, greedy, True).all(-1)

        self._scorer = (score, mesh)
        return self._scorer

    def loglikelihoods(self, rows: list[tuple[list[int], list[int]]], max_length: int) -> list[tuple[float, bool]]:
        """For each (context, continuation) of token ids: log P(continuation | context) and
        whether greedy decoding gives the continuation. Rows longer than `max_length` + 1 keep
        their end (lm-eval's transformers backend does the same); batches of `slots` rows of
        one padded length, longest first."""
        import jax
        import jax.numpy as jnp

        started = time.monotonic()
        score, mesh = self._score_fn()
        order = sorted(range(len(rows)), key=lambda i: -(len(rows[i][0]) + len(rows[i][1])))
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        start = 0
        while start < len(order):
            # The longest row first sets the batch's length, and the logits' budget its rows.
            longest = min(len(rows[order[start]][0]) + len(rows[order[start]][1]), max_length + 1) - 1
            length = bucket(longest, self.multiple, math.inf)
            batch = max(1, min(self.slots, SCORING_LOGITS_BYTES // (length * self.config.vocab_size * 4)))
            chunk = order[start : start + batch]
            start += batch
            whole = [(rows[i][0] + rows[i][1])[-(max_length + 1) :] for i in chunk]
            shape = (batch, length)
            tokens, targets, positions, segments = (np.zeros(shape, np.int32) for _ in range(4))
            weights = np.zeros(shape, np.float32)
            for r, (i, w) in enumerate(zip(chunk, whole, strict=True)):
                n = len(w) - 1
                tokens[r, :n], targets[r, :n] = w[:-1], w[1:]
                positions[r, :n] = np.arange(n)
                segments[r, :n] = 1
                cont = min(len(rows[i][1]), n)
                weights[r, n - cont : n] = 1.0
            with mesh:
                logp, greedy = score(
                    self.params, *(jnp.asarray(a) for a in (tokens, positions, segments, targets, weights))
                )
            logp, greedy = jax.device_get((logp, greedy))
            for r, i in enumerate(chunk):
                out[i] = (float(logp[r]), bool(greedy[r]))
        self.timing.score_s += time.monotonic() - started
        self.timing.scored_rows += len(rows)
        return out
