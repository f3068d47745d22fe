"""Bootstrap.load: read and verify a core, authorize it, validate its contract, and load
the frontend assets (the specification, "Ownership and bootstrap").

Every startup failure becomes one `StartupError` whose message is one clear line: the
CLI prints it without a traceback and exits 2.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from helios_contract.errors import ContractError, MissingGraphVariantError
from helios_contract.prepared import PreparedContract
from helios_contract.schema import contract_pb2, core_pb2
from helios_tools.core.errors import CoreError, NamespaceMismatch, ProtectedChunkError
from helios_tools.core.reader import authorize, open_core
from helios_tools.core.signing import load_public_key
from helios_tools.frontend_assets import load_tokenizer
from helios_tools.lint import chat_template_findings, resource_findings

from helios_serve.frontend.errors import FrontendConfigError
from helios_serve.frontend.pipeline import Frontend
from helios_serve.frontend.syntax import FrontendSyntax
from helios_serve.startup import StartupLog


class StartupError(Exception):
    """The server cannot start; the message is one line naming what is wrong.

    Attributes:
        rule: the id of the broken contract rule when there is one (``lint-core`` reports
            the same rule for the same core), else "".
    """

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule


@dataclass
class Bootstrap:
    """A verified, authorized core's serving metadata and frontend assets.

    Attributes:
        contract: the version 3 ServingContract (validated).
        tokenizer: the frontend `tokenizers.Tokenizer`.
        tokenizer_json: its JSON text (llguidance builds its token table from it).
        chat_template: the Jinja2 chat template text (rendered sandboxed).
        frontend: the startup-validated output frontend (parsers chosen by enum).
        core: the open core (NativeModel.load reads resources through it), or None
            for test-built bootstraps.
        prepared: the PreparedContract, or None for test-built bootstraps.
    """

    contract: contract_pb2.ServingContract
    tokenizer: Any
    tokenizer_json: str
    chat_template: str
    frontend: Frontend
    core: Any = None
    prepared: Any = None

    @classmethod
    def load(
        cls,
        core_path: str | os.PathLike[str],
        trusted_keys: Sequence[Any],
        acceptance: str,
        *,
        resource_key: bytes | None = None,
        log: StartupLog | None = None,
    ) -> Bootstrap:
        """Open, verify and authorize a core; validate its contract; load its assets.

        Args:
            core_path: the core file (payload or logical-resource core).
            trusted_keys: Ed25519 public keys (objects, raw or PEM bytes) or paths to them.
            acceptance: must equal the signed publisher namespace byte for byte.
            resource_key: the operator's 32-byte AES-256 key; ProtectedIndex version 4
                cores need it, other cores do not read it.
            log: the phases "verify" (signature, namespace) and "contract" (validation,
                tokenizer, chat template, frontend) are recorded here.

        Raises:
            StartupError: a bad or untrusted core, a wrong namespace, a version 4 core
                without its resource key or with another key, an invalid contract, a
                contract the manifest does not match, or missing frontend assets.
        """
        log = log if log is not None else StartupLog()
        started = time.perf_counter()
        keys = []
        for key in trusted_keys:
            if isinstance(key, str | os.PathLike):
                try:
                    keys.append(load_public_key(key))
                except OSError as exc:
                    raise StartupError(f"cannot read trusted key {key}: "
                                       f"{exc.strerror or _line(exc)}") from None
                except ValueError as exc:  # its message names the file already
                    raise StartupError(f"cannot read trusted key: {_line(exc)}") from None
            else:
                keys.append(key)
        try:
            core = open_core(core_path, keys, resource_key=resource_key)
        except FileNotFoundError:
            raise StartupError(f"bad core: {core_path}: no such file") from None
        except (CoreError, OSError) as exc:
            raise StartupError(f"bad core: {core_path}: {_line(exc)}") from None
        with ExitStack() as owned:  # closes the core on every failure below
            owned.callback(core.close)
            try:
                authorize(core, acceptance)
            except NamespaceMismatch as exc:
                raise StartupError(f"wrong namespace: {_line(exc)}", "core.authorize") from None
            except CoreError as exc:
                raise StartupError(f"core not authorized: {_line(exc)}", "core.authorize") \
                    from None
            if core.protected_version == 4 and resource_key is None:
                raise StartupError(f"{core_path} is a logical-resource core with encrypted "
                                   "resources (ProtectedIndex version 4): pass --resource-key "
                                   "FILE or set HELIOS_RESOURCE_KEY_FILE")
            carrier = ("payload core" if core.protected_version is None
                       else f"ProtectedIndex version {core.protected_version}")
            log.record("verify", time.perf_counter() - started,
                       f"{carrier}, signature (key {core.key_id}), namespace {core.namespace}, "
                       f"{len(core.resources)} resources")
            started = time.perf_counter()
            try:
                prepared = PreparedContract.from_contract(core.contract, core.manifest)
            except MissingGraphVariantError as exc:
                raise StartupError(f"missing graph variant: {_line(exc)}", exc.rule) from None
            except ContractError as exc:
                raise StartupError(f"invalid contract: {_line(exc)}", exc.rule) from None
            for finding in resource_findings(prepared.serving, prepared.manifest,
                                             core.resources.values()):
                raise StartupError(f"bad core: {core_path}: {finding}", finding.rule)
            try:
                tokenizer_json = _resource_text(core, core_pb2.RESOURCE_KIND_TOKENIZER,
                                                "tokenizer")
                template = _resource_text(core, core_pb2.RESOURCE_KIND_CHAT_TEMPLATE,
                                          "chat template")
                bootstrap = cls.from_parts(prepared.serving, tokenizer_json, template,
                                           core=core, prepared=prepared)
            except ProtectedChunkError as exc:  # the first encrypted chunk read decides the key
                raise StartupError(f"wrong resource key for {core_path} (or a damaged core): "
                                   f"{_line(exc)}") from None
            except CoreError as exc:
                raise StartupError(f"bad core: {core_path}: {_line(exc)}") from None
            log.record("contract", time.perf_counter() - started,
                       f"contract version {prepared.source_version}, "
                       f"{len(prepared.graphs)} graphs, tokenizer, chat template, frontend")
            owned.pop_all()  # the Bootstrap owns the open core now
            return bootstrap

    @classmethod
    def from_parts(
        cls,
        contract: contract_pb2.ServingContract,
        tokenizer_json: str,
        chat_template: str,
        *,
        core: Any = None,
        prepared: Any = None,
    ) -> Bootstrap:
        """Build from a validated contract and the frontend assets (tests use this directly).

        Raises:
            StartupError: an invalid tokenizer, chat template or frontend contract.
        """
        try:
            tokenizer = load_tokenizer(tokenizer_json)
        except ValueError as exc:
            raise StartupError(f"bad tokenizer resource: {_line(exc)}", "frontend.tokenizer") \
                from None
        # Compile and probe now: a template that cannot compile, loads other templates or
        # exceeds its limits on the smallest conversation would fail every request.
        for finding in chat_template_findings(chat_template):
            raise StartupError(f"bad chat template: {finding.detail}", finding.rule)
        try:
            syntax = FrontendSyntax.from_contract(contract.model.frontend)
            frontend = Frontend(syntax, tokenizer, tuple(contract.eos_token_ids))
        except FrontendConfigError as exc:
            raise StartupError(f"unsupported frontend contract: {_line(exc)}", exc.rule) \
                from None
        except ValueError as exc:
            raise StartupError(f"unsupported frontend contract: {_line(exc)}") from None
        return cls(contract, tokenizer, tokenizer_json, chat_template, frontend, core, prepared)

    # -- serving metadata ---------------------------------------------------------------

    @property
    def served_id(self) -> str:
        return self.contract.served_id

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(self.contract.aliases)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.contract.eos_token_ids)

    @property
    def defaults(self) -> contract_pb2.ServingDefaults:
        return self.contract.defaults

    @property
    def template_variables(self) -> dict[str, str]:
        """Special-token strings the chat template refers to by name."""
        t = self.contract.template_tokens
        return {
            k: v
            for k, v in (
                ("bos_token", t.bos_token),
                ("eos_token", t.eos_token),
                ("pad_token", t.pad_token),
            )
            if v
        }

    def close(self) -> None:
        """Close the core (NativeModel.load has read what it needs); idempotent."""
        if self.core is not None:
            self.core.close()

    def __enter__(self) -> Bootstrap:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _resource_text(core: Any, kind: int, what: str) -> str:
    """The one resource of `kind` as text (`resource_findings` checked there is one)."""
    (rid,) = [rid for rid, res in core.resources.items() if res.kind == kind]
    try:
        return bytes(core.read_resource(rid)).decode("utf-8")
    except UnicodeDecodeError:
        rule = "frontend.tokenizer" if kind == core_pb2.RESOURCE_KIND_TOKENIZER else \
            "frontend.chat_template"
        raise StartupError(f"bad core: the {what} resource is not UTF-8 text", rule) from None


def _line(exc: BaseException) -> str:
    """An exception as one line."""
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())
