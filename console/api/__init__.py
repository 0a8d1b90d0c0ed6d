"""The REST API: views, serializers, authentication, tokens, parsers, throttles and errors."""
