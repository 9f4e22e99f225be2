"""LocalEngine: a request's text turned into a Sequence, run in this process by the shared engine loop
over any executor (torch's, llama.cpp's).

The loop (core.py) does iteration-level (continuous) batching, each step schedule -> execute ->
update: the Scheduler plans (scheduler.py), the executor runs the forward passes and owns the rows
(a ModelBackend, executor.py: transformers' in torch/executor.py by default, llama.cpp's in
llamacpp/executor.py), the OutputProcessor applies each token (output.py). This module is the caller's
side: validation and tokenization on the caller's thread, so a bad request fails alone, at submit.

Text rules. `messages` go through the chat template (add_generation_prompt=True). A raw `prompt` is
wrapped as one user message when the request's template is "chat" (or unset and
EngineConfig.prompt_as_chat, the default) and the tokenizer has a template; with template "none" it
is tokenized verbatim, as OpenAI's /v1/completions continues text. prompt_tokens counts the prompt
after the chat template. A request with a json_schema gets its grammar's matcher here
(sampling/structured.py).

Failures: a bad request (prompt too long for the context, empty, bad parameters) fails that future
with `invalid_request` and nothing else; see core.py for failing prefills and fatal errors.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING

from workers.engine.config import EngineConfig
from workers.engine.core import EngineCore
from workers.engine.detokenizer import IncrementalText
from workers.engine.executor import ModelBackend
from workers.engine.parallel import SampleGroup, sample_count
from workers.engine.prompts import tokenize
from workers.engine.sampling.sampler import make_generator
from workers.engine.sequence import Sequence
from workers.engine.types import (
    EngineStats,
    ErrorType,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    RequestError,
)
from workers.engine.validation import check_vocabulary, validate_params

if TYPE_CHECKING:
    from workers.engine.torch.loading import LoadedModel


class LocalEngine:
    """Continuous batching over a causal LM with a transformers tokenizer (see the module docstring).

    The executor defaults to the transformers model (`loaded`, or config.model loaded at start())."""

    def __init__(
        self, config: EngineConfig, loaded: LoadedModel | None = None, executor: ModelBackend | None = None
    ) -> None:
        self.model_id = config.model
        self.fingerprint = loaded.fingerprint if loaded else ""
        self.label = loaded.label if loaded else ""
        self._config = config
        self._executor: ModelBackend = executor or _transformers_executor(config, loaded)
        self._core = EngineCore(config, self._executor)
        #: A multi-sample request's id -> its samples' ids (cancel() stops them all).
        self._groups: dict[str, list[str]] = {}
        self._groups_lock = threading.Lock()
        # Fast tokenizers are not safe to share across threads: callers encode, the loop decodes.
        self._tokenizer_lock = threading.Lock()

    @property
    def fatal_error(self) -> FatalEngineError | None:
        """Set (once) when the engine died; the worker should exit non-zero."""
        return self._core.fatal_error

    # ---- the Engine protocol -------------------------------------------------------------------

    def start(self) -> None:
        """Load the model (unless given), warm up at the largest batch shape, start the loop (on the
        loop thread: see EngineCore.start). Raises FatalEngineError when the model cannot load or its
        warm-up output is not finite."""
        self._core.start()
        self.fingerprint, self.label = self._executor.fingerprint, self._executor.label

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        if sample_count(request.params) != 1:
            return self._submit_group(request)
        return self._submit_one(request)

    def cancel(self, request_id: str) -> None:
        with self._groups_lock:
            ids = [request_id, *self._groups.get(request_id, ())]
        self._core.cancel(ids)

    def shutdown(self, timeout: float | None = None) -> None:
        self._core.shutdown(timeout)

    def stats(self) -> EngineStats:
        return self._core.stats()

    # ---- caller side -----------------------------------------------------------------------------

    def _submit_group(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        """n or best_of samples: one sequence each, gathered into one future (parallel.py). That
        best_of covers n SamplingParams checked as it was built."""
        group = SampleGroup(request, self.cancel)
        with self._groups_lock:
            self._groups[request.request_id] = [child.request_id for child in group.children]
        group.future.add_done_callback(lambda _: self._forget_group(request.request_id))
        for index, child in enumerate(group.children):
            group.watch(index, self._submit_one(child))
        return group.future

    def _forget_group(self, request_id: str) -> None:
        with self._groups_lock:
            self._groups.pop(request_id, None)

    def _submit_one(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        try:
            self._core.submit(self._sequence(request, future))
        except (RequestError, FatalEngineError) as error:
            future.set_exception(error)
        return future

    def _sequence(
        self, request: GenerationRequest, future: concurrent.futures.Future[GenerationResult]
    ) -> Sequence:
        self._core.check_running()
        validate_params(request)
        check_vocabulary(request.params, self._executor.vocab_size)
        prompt_ids = self._encode(request)
        context = int(self._executor.context_tokens)
        if len(prompt_ids) >= context:
            message = f"prompt is {len(prompt_ids)} tokens; the model's context is {context} tokens"
            raise RequestError(ErrorType.INVALID_REQUEST, message)
        schema = request.params.json_schema
        return Sequence(
            request=request,
            future=future,
            matcher=None if schema is None else self._executor.grammars.matcher(schema),
            prompt_ids=prompt_ids,
            reservation=min(len(prompt_ids) + request.params.max_tokens, context),
            generator=make_generator(request.params),
            submitted_at=time.monotonic(),
            text=IncrementalText(self._decode),
        )

    def _encode(self, request: GenerationRequest) -> list[int]:
        tokenizer = self._executor.tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        messages = request.messages
        if messages is None and self._wraps_prompt(request) and has_template:
            messages = [{"role": "user", "content": request.prompt or ""}]
        if messages is not None and not has_template:
            raise RequestError(ErrorType.INVALID_REQUEST, "this model has no chat template: send a prompt")
        try:
            with self._tokenizer_lock:
                ids = tokenize(tokenizer, request.prompt or "", messages)
        except Exception as exc:  # a template rejecting the messages (roles, order) is the client's error
            raise RequestError(ErrorType.INVALID_REQUEST, f"cannot apply the chat template: {exc}") from exc
        if not ids:
            raise RequestError(ErrorType.INVALID_REQUEST, "prompt is empty")
        return [int(token) for token in ids]

    def _wraps_prompt(self, request: GenerationRequest) -> bool:
        if request.template is None:
            return self._config.prompt_as_chat
        return request.template == "chat"

    def _decode(self, tokens: list[int], skip_special_tokens: bool) -> str:
        tokenizer = self._executor.tokenizer
        with self._tokenizer_lock:
            return str(tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens))


def _transformers_executor(config: EngineConfig, loaded: LoadedModel | None) -> ModelBackend:
    # Imported here: transformers' model code costs ~140 MB resident and seconds of start-up that a
    # worker on another executor (llama.cpp's) never needs.
    from workers.engine.torch.executor import ModelExecutor

    return ModelExecutor(config, loaded)
