"""The validator handoff: the envelope and verdict a validator exchanges (envelope.py), the
`Validator` role and the built-in check (validation.py), the HTTP validator
(validation_http.py), a round's candidates asked for their verdicts (candidates.py), the
audit log (audit.py) and the identity of one tool-call action (idempotency.py)."""
