"""The NATS bridge, loaded only as `arm_core.bridge` (arm_core/bridge links here).

Imported as a top-level `bridge` from the repository root it would be a second copy of
every module, with its own settings and state: refuse that at once."""

if __name__ != "arm_core.bridge":
    raise ImportError(f"import arm_core.bridge, not {__name__}: bridge/ is part of arm_core")
