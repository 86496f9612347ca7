// idemgate operator console: live pages over server-sent events. The pages
// work without this file; it keeps the queue and a record page current,
// and ages ticking. No framework, no inline script (the CSP forbids it).
(function () {
  'use strict';
  var body = document.body;
  var QUEUE = { awaiting_approval: true, uncertain: true };

  function ago(ms) {
    var s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
    if (s < 60) return s + 's';
    var m = Math.floor(s / 60);
    if (m < 60) return m + 'm';
    var h = Math.floor(m / 60);
    if (h < 24) return h + 'h ' + (m % 60) + 'm';
    return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
  }
  function tickAges() {
    var ts = document.querySelectorAll('time[data-age]');
    for (var i = 0; i < ts.length; i++) {
      var t = Date.parse(ts[i].dateTime);
      if (!isNaN(t)) ts[i].textContent = ago(t);
    }
  }
  setInterval(tickAges, 10000);

  var live = body.dataset.live;
  if (!live || !window.EventSource) return;
  var status = document.getElementById('live-status');
  function setStatus(text, cls) {
    if (!status) return;
    status.textContent = text;
    status.className = 'live ' + (cls || '');
  }

  // parse turns server-drawn HTML into nodes.
  function parse(html) {
    var t = document.createElement('template');
    t.innerHTML = html;
    return t.content;
  }
  // dirty reports whether a form field in root holds what the operator typed.
  function dirty(root) {
    var fs = root.querySelectorAll('input, textarea, select');
    for (var i = 0; i < fs.length; i++) {
      var f = fs[i];
      if (f.type === 'hidden') continue;
      if (f.type === 'radio' || f.type === 'checkbox') { if (f.checked !== f.defaultChecked) return true; continue; }
      if (f.value !== f.defaultValue) return true;
    }
    return false;
  }
  // carry copies what the operator typed from an old entry to its new
  // version, when it still decides the same arguments in the same state.
  function carry(from, to) {
    if (from.dataset.fingerprint !== to.dataset.fingerprint || from.dataset.status !== to.dataset.status) return;
    var fs = from.querySelectorAll('input:not([type=hidden]), textarea');
    for (var i = 0; i < fs.length; i++) {
      var f = fs[i], g = to.querySelector('[name="' + f.name + '"]' + (f.type === 'radio' ? '[value="' + f.value + '"]' : ''));
      if (!g) continue;
      if (f.type === 'radio') g.checked = f.checked; else g.value = f.value;
    }
  }

  var since = body.dataset.since;
  var known = {}; // key → the newest revision this page has seen
  var busy = false, pending = [];

  // ---- the queue ----
  function list() { return document.getElementById('queue'); }
  function entry(key) {
    var l = list();
    if (!l) return null;
    var items = l.children;
    for (var i = 0; i < items.length; i++) if (items[i].dataset.key === key) return items[i];
    return null;
  }
  function emptyNote() {
    var e = document.getElementById('queue-empty'), l = list();
    if (e && l) e.hidden = l.children.length > 0;
  }
  function place(li) {
    var old = entry(li.dataset.key), l = list();
    if (!l) return;
    if (old) {
      if (+old.dataset.rev >= +li.dataset.rev) return;
      carry(old, li);
      if (old.dataset.fingerprint !== li.dataset.fingerprint && old.dataset.status === li.dataset.status) {
        var note = li.querySelector('.changed');
        if (note) note.hidden = false;
      }
      l.replaceChild(li, old);
    } else {
      var created = +li.dataset.created, items = l.children, before = null;
      for (var i = 0; i < items.length; i++) if (+items[i].dataset.created > created) { before = items[i]; break; }
      l.insertBefore(li, before);
      li.classList.add('fresh');
    }
    emptyNote();
  }
  function queueChange(c) {
    if (known[c.key] && known[c.key] >= c.rev) return;
    known[c.key] = c.rev;
    var old = entry(c.key);
    if (c.deleted || !QUEUE[c.status]) {
      if (old && +old.dataset.rev < c.rev) { old.remove(); emptyNote(); }
      return;
    }
    fetch('/console/queue/item/' + encodeURIComponent(c.key), { credentials: 'same-origin' }).then(function (r) {
      if (r.status === 204) {
        var o = entry(c.key);
        if (o && +o.dataset.rev <= c.rev) { o.remove(); emptyNote(); }
        return null;
      }
      if (!r.ok) throw new Error(r.status);
      return r.text();
    }).then(function (html) {
      if (!html) return;
      var li = parse(html).querySelector('li.item');
      if (li) place(li);
    }).catch(function () { setStatus('live: an update failed, reload', 'off'); });
  }
  // reread replaces the whole list after the page lost track of changes.
  function reread() {
    busy = true;
    fetch('/console/queue/items', { credentials: 'same-origin' }).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r.text();
    }).then(function (html) {
      var box = document.getElementById('queue-live'), fresh = parse(html).querySelector('#queue-live');
      if (box && fresh) {
        var olds = box.querySelectorAll('li.item');
        for (var i = 0; i < olds.length; i++) {
          var n = fresh.querySelector('li.item[data-key="' + CSS.escape(olds[i].dataset.key) + '"]');
          if (n) carry(olds[i], n);
        }
        box.replaceWith(fresh);
      }
      known = {};
      busy = false;
      var p = pending; pending = [];
      p.forEach(queueChange);
      tickAges();
    }).catch(function () { busy = false; setStatus('live: reload the page', 'off'); });
  }
  function counts(n) {
    for (var s in n) {
      var dd = document.querySelector('[data-count="' + s + '"]');
      if (dd) dd.textContent = n[s];
    }
  }

  // ---- a record ----
  // The page is redrawn when its record changes and when its history grows
  // (an audit event written after the record), one redraw at a time.
  var shownRev = +body.dataset.rev || 0;
  var drawing = false, redraw = false;
  function recordChange(c) {
    if (c.rev <= shownRev) return;
    shownRev = c.rev;
    refreshRecord();
  }
  function refreshRecord() {
    if (drawing) { redraw = true; return; }
    var main = document.getElementById('main');
    var note = document.getElementById('record-changed');
    if (dirty(main) || (document.activeElement && main.contains(document.activeElement) && document.activeElement.matches('input, textarea'))) {
      if (note) note.hidden = false;
      return;
    }
    drawing = true;
    var done = function () {
      drawing = false;
      if (redraw) { redraw = false; refreshRecord(); }
    };
    // The header keeps the session's messages for the page shown next.
    fetch(location.href, { credentials: 'same-origin', headers: { 'Idem-Console-Live': '1' } }).then(function (r) { return r.text(); }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, 'text/html');
      var m = doc.getElementById('main');
      if (!m) return;
      var flashes = document.getElementById('flashes');
      main.innerHTML = m.innerHTML;
      var f = document.getElementById('flashes');
      if (flashes && f && !f.children.length) f.replaceWith(flashes);
      shownRev = Math.max(shownRev, +doc.body.dataset.rev || 0);
      tickAges();
    }).catch(function () { if (note) note.hidden = false; }).then(done);
  }

  function connect() {
    var url = '/console/events?since=' + encodeURIComponent(since || '');
    if (live === 'record') url += '&key=' + encodeURIComponent(body.dataset.key);
    var es = new EventSource(url);
    es.addEventListener('ready', function (e) {
      var d = JSON.parse(e.data);
      setStatus('live', 'on');
      if (d.position) since = d.position;
      if (d.resync) { if (live === 'queue') reread(); else refreshRecord(); }
    });
    es.addEventListener('change', function (e) {
      var c = JSON.parse(e.data);
      if (live === 'record') { if (c.key === body.dataset.key) recordChange(c); return; }
      if (busy) pending.push(c); else queueChange(c);
    });
    es.addEventListener('history', function () { if (live === 'record') refreshRecord(); });
    es.addEventListener('counts', function (e) { if (live === 'queue') counts(JSON.parse(e.data)); });
    es.addEventListener('expired', function () {
      es.close();
      setStatus('session ended: log in again', 'off');
    });
    es.onerror = function () { setStatus('reconnecting…', 'off'); };
  }
  connect();
})();
