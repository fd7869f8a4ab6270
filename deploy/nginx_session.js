// nginx's njs (Debian libnginx-mod-http-js; built into the nginx image): the session key a request is
// routed by, so every turn of a conversation reaches the replica whose prefix cache holds it
// (nginx.conf: location / and upstream decoda_sticky). In order:
//   1. the X-Session-Id header, when the client sends one;
//   2. the body's prompt_cache_key (OpenAI's field for exactly this, on chat completions and Responses);
//   3. the conversation tag of the body's previous_response_id: the first 16 hex digits of the id,
//      which every response of one conversation shares (server/api/responses/ids.py).
// No key (or a body that is not JSON, or one too large to stay in memory): "" and the request goes to
// the replica with the fewest open connections, as before.

function sessionKey(r) {
    var header = r.headersIn['X-Session-Id'];
    if (header) {
        return 'session:' + header;
    }
    var text = r.requestText;  // js_content has read the body (client_body_buffer_size keeps it in memory)
    if (!text) {
        return '';
    }
    var body;
    try {
        body = JSON.parse(text);
    } catch (e) {
        return '';
    }
    if (body === null || typeof body !== 'object') {
        return '';
    }
    if (typeof body.prompt_cache_key === 'string' && body.prompt_cache_key) {
        return 'cache:' + body.prompt_cache_key;
    }
    if (typeof body.previous_response_id === 'string') {
        var tagged = /^resp_([0-9a-f]{16})[0-9a-f]{16}$/.exec(body.previous_response_id);
        if (tagged) {
            return 'conversation:' + tagged[1];
        }
    }
    return '';
}

function route(r) {
    var key = sessionKey(r);
    r.variables.decoda_session = key;
    r.internalRedirect(key ? '@sticky' : '@balanced');
}

export default {route, sessionKey};
