"""Names that vulture (`make lint-dead`) cannot see being used, each with the caller that uses it.

Decorated entry points (FastAPI routes and exception handlers, kopf handlers, pydantic validators,
pytest fixtures) are skipped by `ignore_decorators` in pyproject.toml instead. A name here marks every
definition of that name as used, so keep the list short and specific.
"""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# --- called by a framework through its name ----------------------------------------------------------
_.forward  # torch: nn.Module.__call__ runs `forward`
_.model_config  # pydantic: a model's configuration (extra="forbid", frozen, ...)
_.__getattr__  # Python (PEP 562): engine/__init__.py's lazy exports
_.ignore_aliases  # PyYAML: SafeDumper asks it (operator/crd.py writes repeated lists in full)
_.should_exit  # uvicorn: Server's main loop polls it (engine/server/cli.py sets it after draining)
_.intercepted_binops  # jinja2: the sandbox routes these operators to call_binop (engine/server/chat_template.py)
_.call_binop
_.pytestmark  # pytest: a module's marks
_.pytest_collection_modifyitems  # pytest: a conftest hook
_.pytest_collection_finish  # pytest: a conftest hook (tests/images: starts the image build)
_.pytest_sessionfinish  # pytest: a conftest hook
_.remove_lora  # engine/engine_call.py: EngineCall("remove_lora") runs it by name in the engine core
_.token_classify  # engine/engine_call.py: EngineCall("token_classify") runs it by name (the /pooling route)
_.do_GET  # http.server: BaseHTTPRequestHandler runs do_<METHOD> (tests/operator/test_operator_hostile.py)
_.log_message  # http.server: BaseHTTPRequestHandler logs through it (silenced in the same test)
_.effort  # pydantic: engine/server/responses.py's ReasoningOptions fields, validated and echoed by model_dump
_.generate_summary
_.prompt_cache_key  # pydantic: engine/server/responses.py's ResponsesRequest field, typed as vLLM's, which ignores it

# --- attributes a library reads after we set them ----------------------------------------------------
# kopf's OperatorSettings (operator/main.py, settings_for)
_.progress_storage
_.diffbase_storage
_.finalizer
_.level
_.connect_timeout
_.server_timeout
_.reconnect_backoff
_.request_timeout
_.error_backoffs
_.ultimate_exiting_timeout
_.managed
_.pre_tokenizer  # tokenizers: Tokenizer.pre_tokenizer, used when encoding (bench/model_dirs.py)
_.initializer_range  # transformers: read when a model initialises its weights (tests/conftest.py)

# --- fields of an external format, read and written by pydantic or dataclasses.asdict by name ---------
_.continuous_usage_stats  # OpenAI `stream_options` (engine/server/protocol.py): accepted, as vLLM does
_.tool_call_id  # a chat message's (engine/server/protocol.py): typed as vLLM's, read by the chat template
_.effect  # Kubernetes toleration fields (operator/spec.py), copied into the pod spec
_.toleration_seconds
_.adapters  # the CRD's LoRA spec (operator/spec.py); refused until --enable-lora is implemented
_.max_loras
_.last_transition_time  # status conditions and figures (operator/status.py), written to the status
_.observed_generation
_.ready_replicas
_.kv_budget_bytes  # operator/fit.py FitReport -> status.fit through asdict
_.kv_cache_usage_percent  # status.serving figures (operator/status.py), written by serving_status.py
_.prefix_cache_hit_rate_percent
_.window_seconds
_.scraped
# Structured-output request fields (engine/server/protocol.py, engine/structured_output/params.py), read
# by name through getattr in engine/server/structured_request.py and StructuredOutputsParams._value.
_.guided_json
_.guided_regex
_.guided_choice
_.guided_grammar
_.json_object
# pickle's hooks, called by name (engine/step_channel.py)
_.persistent_id
_.persistent_load
# Fields of the pydantic schema LangChain sends as response_format (tests/engine/server/test_structured_api_core.py).
_.city
_.sky
# Read by FastAPI/Starlette, not by name here: APIRouter.route_class (engine/server/app.py) and Request._json, the
# parsed-body cache that Request.json() returns (engine/server/request_body.py).
_.route_class
_._json
# Request._body, the raw-body cache that Request.body() returns (replaced by a stand-in once parsed: request_body.py).
_._body
# RopeScaling (operator/spec.py): read through model_dump into engine_rules.rope_scaled_length.
_.original_max_position_embeddings
# Settings read by the libraries they configure: the kubernetes client's pool size (operator/kube.py) and kopf's
# handler threads (operator/main.py).
_.connection_pool_maxsize
_.max_workers
# ScoreRequest's sides (engine/server/score.py): read by name through SCORE_SIDES.
_.text_1
_.text_2
_.data_1
_.data_2
# llama.cpp's quantize parameters (bench/gguf_kquant_files.py): fields of a ctypes struct that llama.cpp reads.
_.ftype
_.allow_requantize
