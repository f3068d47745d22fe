"""The OpenAI Responses API over the chat path.

    schema        request body -> a validated `ResponsesRequest` and canonical input items
    conversation  items (stored turns + new input) -> the chat path's `ChatInput`
    presenter     the worker's events -> typed Responses stream events and the response
    store         stored responses: an embedded SQLite database, bounded, oldest evicted

Nothing here forks the chat path: preparation, parsers, stops, grammar and admission
are the chat completions' own (`frontend.prepare.Preparer.chat`, `http.service`).
"""
