// Live refresh, a progressive enhancement: on each server-sent event (at most one a second) the page's main
// content is read again and swapped in, unless the user is typing in a form there. Without JavaScript the
// pages are complete; reload them to refresh.
(function () {
  var main = document.getElementById('main');
  if (!main || !window.EventSource || !main.dataset.live) return;
  var busy = false;
  var source = new EventSource('/events');
  source.onmessage = function () {
    var active = document.activeElement;
    if (busy || (active && main.contains(active) && /INPUT|SELECT|TEXTAREA/.test(active.tagName))) return;
    busy = true;
    fetch(main.dataset.live, { credentials: 'same-origin' }).then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        var next = new DOMParser().parseFromString(text, 'text/html').getElementById('main');
        if (next) { main.innerHTML = next.innerHTML; main.dataset.updated = String(Date.now()); }
      }).finally(function () { busy = false; });
  };
})();
