"""What fairgate says to providers: the wire formats and their translations.

Chat completions, Anthropic messages and the Responses API: translation between them
(``translate``, ``responses``, ``responses_upstream``), server-sent events (``sse``), usage as
each wire reports it (``usage``) and prices (``pricing``). Pure functions over bodies and events:
how the bytes travel is ``fairgate.providers``' concern.
"""
