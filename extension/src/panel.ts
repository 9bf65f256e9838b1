import { ILabShell } from '@jupyterlab/application';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { IBackend, ICatalog, IDeleted, IForward, IHost, ISlice, ISlices, ISnapshot, IStacks, requestAPI } from './api';
import { tpuIcon } from './icon';
import { fillDatalist, launchCommand, launchInNotebook, parseAccelerator, parseSlices } from './launch';

/** Refresh every 3 s while visible; on errors back off up to a minute; stand by when the tab is hidden. */
const FREQUENCY = { interval: 3000, backoff: true, max: 60000 };
const METRICS: [string, string][] = [
  ['cpu', 'CPU'],
  ['memory', 'Mem'],
  ['hbm', 'HBM']
];

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export function formatDuration(seconds: number | null): string {
  if (seconds === null || seconds === undefined) {
    return '–';
  }
  const s = Math.max(0, Math.floor(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}

/** Bytes in binary units, as tpunb.units.format_bytes says them: 1536 -> '1.5 KiB'. */
export function formatBytes(n: number): string {
  if (Math.abs(n) < 1024) {
    return `${n.toFixed(0)} bytes`;
  }
  let value = n / 1024;
  for (const unit of ['KiB', 'MiB', 'GiB']) {
    if (Math.abs(value) < 1024) {
      return `${value.toFixed(1)} ${unit}`;
    }
    value /= 1024;
  }
  return `${value.toFixed(1)} TiB`;
}

function percentText(fraction: number): string {
  const percent = fraction * 100;
  return `${percent.toFixed(percent < 10 ? 1 : 0)}%`;
}

/** A host's bar: how full (0..1), the short text beside it and the hover text with units. The
 * API gives fractions (cpu, memory, hbm) and the raw latest values they came from. */
export function describeMetric(
  key: string,
  label: string,
  metrics: { [key: string]: number }
): { fraction?: number; text: string; title: string } {
  const fraction = metrics[key];
  if (key === 'memory' && fraction !== undefined && metrics.memory_total_bytes) {
    const total = metrics.memory_total_bytes;
    const used = formatBytes(fraction * total);
    return { fraction, text: used, title: `${label}: ${used} used of ${formatBytes(total)} (${percentText(fraction)})` };
  }
  if (key === 'hbm' && metrics.hbm_used_bytes !== undefined) {
    const used = formatBytes(metrics.hbm_used_bytes);
    const of = metrics.hbm_total_bytes
      ? `of ${formatBytes(metrics.hbm_total_bytes)} (${percentText(metrics.hbm_used_bytes / metrics.hbm_total_bytes)})`
      : 'by live arrays (this host reports no HBM total)';
    return { fraction, text: used, title: `${label}: ${used} used ${of}` };
  }
  if (fraction === undefined) {
    return { text: '–', title: `${label}: no metrics yet` };
  }
  if (key === 'cpu') {
    return { fraction, text: percentText(fraction), title: `${label}: ${percentText(fraction)} busy` };
  }
  return { fraction, text: percentText(fraction), title: `${label}: ${percentText(fraction)}` };
}

function formatUsd(value: number | null, suffix = ''): string {
  if (value === null || value === undefined) {
    return 'price unknown';
  }
  return `$${value.toLocaleString(undefined, { minimumFractionDigits: 2, maximumFractionDigits: 2 })}${suffix}`;
}

/** A forward's link: through jupyter-server-proxy under this page's base URL when the server has it
 * (it works from a browser on another machine), else the kernel machine's own address. */
export function forwardLink(forward: IForward, baseUrl: string): string {
  return forward.proxy ? URLExt.join(baseUrl, forward.proxy) : forward.url;
}

/** What a slice serves: a line per service and host (its state), a line saying which services keep
 * it busy and at what price, and a link per forward. */
function servingList(slice: ISlice, backend: IBackend | undefined): HTMLElement {
  const box = el('div', 'jp-tpunb-Serving');
  const busy = slice.busy_services ?? [];
  if (busy.length) {
    const price = backend?.free ? '$0.00/h (simulated)' : formatUsd(slice.usd_per_hour, '/h');
    const names = busy.join(', ');
    box.append(
      el('div', 'jp-tpunb-Busy', `${busy.length > 1 ? 'services' : 'service'} ${names} keep${busy.length > 1 ? '' : 's'} it busy · ${price}`)
    );
  }
  const list = el('ul', 'jp-tpunb-Services');
  for (const service of slice.services ?? []) {
    const row = el('li', 'jp-tpunb-Service');
    row.dataset.service = service.service;
    row.dataset.host = String(service.host);
    row.title = service.command;
    row.append(
      el('span', 'jp-tpunb-ServiceName', service.service),
      el('span', 'jp-tpunb-ServiceHost', `host ${service.host}${service.port ? `:${service.port}` : ''}`),
      el('span', 'jp-tpunb-ServiceState', service.state)
    );
    list.append(row);
  }
  for (const forward of slice.forwards ?? []) {
    const row = el('li', 'jp-tpunb-Forward');
    const link = el('a', 'jp-tpunb-ForwardLink', `host ${forward.host}:${forward.port}`);
    link.href = forwardLink(forward, PageConfig.getBaseUrl());
    link.target = '_blank';
    link.rel = 'noopener';
    link.title = `${link.href} reaches port ${forward.port} on host ${forward.host}`;
    row.append(el('span', 'jp-tpunb-ForwardArrow', 'port →'), link);
    list.append(row);
  }
  box.append(list);
  return box;
}

/** Where a snapshot is stored, shortly: its folder's last parts, or its gs:// URI (the whole in the title). */
export function snapshotPlace(snapshot: ISnapshot): string {
  if (snapshot.where === 'gs') {
    return snapshot.uri;
  }
  const parts = snapshot.uri.split('/').filter(part => part);
  return parts.length > 2 ? `…/${parts.slice(-2).join('/')}` : snapshot.uri;
}

/** The snapshots this machine knows, newest first: what they hold, the slice shape they came from,
 * their size, age and where they are stored (a local folder, or Cloud Storage, which bills). */
function snapshotList(snapshots: ISnapshot[], problem: string | null | undefined): HTMLElement {
  const box = el('section', 'jp-tpunb-Snapshots');
  box.append(el('h3', '', 'Snapshots'));
  if (problem) {
    box.append(el('div', 'jp-tpunb-Error', problem));
  }
  const list = el('ul', 'jp-tpunb-SnapshotList');
  for (const snapshot of [...snapshots].reverse()) {
    const row = el('li', 'jp-tpunb-Snapshot');
    row.dataset.uri = snapshot.uri;
    row.dataset.where = snapshot.where;
    row.title = `${snapshot.uri}${snapshot.slice ? ` (from ${snapshot.slice})` : ''}`;
    const size = snapshot.size_bytes === null ? '' : formatBytes(snapshot.size_bytes);
    const age = snapshot.age_s === null ? '' : `${formatDuration(snapshot.age_s)} ago`;
    row.append(
      el('span', 'jp-tpunb-SnapshotNames', snapshot.names || (snapshot.complete ? '?' : 'incomplete')),
      el('span', 'jp-tpunb-SnapshotShape', snapshot.shape),
      el('span', 'jp-tpunb-SnapshotSize', size),
      el('span', 'jp-tpunb-SnapshotAge', age),
      el('span', 'jp-tpunb-SnapshotWhere', snapshotPlace(snapshot))
    );
    list.append(row);
  }
  box.append(list);
  return box;
}

/** The left-sidebar panel: a card per slice, orphans in red, the snapshots, and a launch form. */
export class SlicesPanel extends Widget {
  constructor(
    private tracker: INotebookTracker,
    private shell: ILabShell
  ) {
    super();
    this.id = 'tpunb-sidebar';
    this.addClass('jp-tpunb-Sidebar');
    this.title.icon = tpuIcon;
    this.title.caption = 'TPU slices';

    const header = el('header', 'jp-tpunb-Header');
    header.append(el('h2', '', 'TPU slices'), this.statusLine);
    this.cards.className = 'jp-tpunb-Cards';
    this.errorLine.className = 'jp-tpunb-Error';
    this.node.append(header, this.errorLine, this.cards, this.snapshots, this.buildLaunchForm());

    this.poll = new Poll({
      factory: () => this.refresh(),
      frequency: FREQUENCY,
      standby: 'when-hidden',
      name: 'tpunb:slices'
    });
    this.catalogLoaded = this.loadCatalog();
  }

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  /** Fetch the slices and redraw; a rejection makes the poll back off. */
  async refresh(): Promise<void> {
    try {
      await this.catalogLoaded; // the backends' labels, before the first card
      const data = await requestAPI<ISlices>('slices');
      this.errorLine.textContent = '';
      this.render(data);
      this.statusLine.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      this.errorLine.textContent = `${(error as Error).message}`;
      throw error;
    }
  }

  private render(data: ISlices): void {
    const all = [...data.slices, ...data.orphans];
    const snapshots = data.snapshots ?? [];
    this.snapshots.replaceChildren(
      ...(snapshots.length || data.snapshots_error ? [snapshotList(snapshots, data.snapshots_error)] : [])
    );
    if (!all.length) {
      this.cards.replaceChildren(
        el('p', 'jp-tpunb-Empty', 'No slices. Launch one below, or run %tpu_launch v4-16 in a notebook.')
      );
      return;
    }
    this.cards.replaceChildren(...all.map(slice => this.card(slice)));
  }

  private card(slice: ISlice): HTMLElement {
    const card = el('section', 'jp-tpunb-Card');
    card.dataset.slice = slice.name;
    if (slice.orphan) {
      card.classList.add('jp-tpunb-orphan');
    }
    const title = el('div', 'jp-tpunb-CardTitle');
    const remove = el('button', 'jp-tpunb-Delete jp-Button jp-mod-minimal', '✕');
    remove.title = `Delete ${slice.name}`;
    remove.setAttribute('aria-label', `Delete ${slice.name}`);
    remove.onclick = () => void this.confirmDelete(slice);
    title.append(el('span', 'jp-tpunb-Name', slice.name), el('span', 'jp-tpunb-Accel', slice.accelerator || '?'), remove);

    const meta = el('div', 'jp-tpunb-Meta');
    const described = this.backends.get(slice.backend);
    const backend = described?.free ? described.label : slice.backend + (slice.spot ? ', spot' : '');
    meta.append(
      el('span', 'jp-tpunb-Backend', backend),
      el('span', 'jp-tpunb-State', slice.state),
      el('span', 'jp-tpunb-Uptime', `up ${formatDuration(slice.age_s)}`)
    );
    const cost = el('div', 'jp-tpunb-Cost');
    if (described?.free) {
      const list = slice.list_usd_per_hour ? ` (${formatUsd(slice.list_usd_per_hour, '/h')} on Cloud TPU)` : '';
      cost.textContent = `$0.00/h · free${list}`;
    } else {
      cost.textContent = `${formatUsd(slice.usd_per_hour, '/h')} · ${formatUsd(slice.usd_so_far)} so far`;
    }
    card.append(title, meta, cost);
    if (slice.idle_delete_failing) {
      card.append(el('div', 'jp-tpunb-IdleFailing', slice.idle_delete_failing));
    } else if (slice.idle_delete_in !== undefined && slice.idle_delete_in !== null) {
      card.append(el('div', 'jp-tpunb-Idle', `idle delete in ${formatDuration(slice.idle_delete_in)}`));
    }
    if (slice.orphan && slice.message) {
      card.append(el('div', 'jp-tpunb-OrphanNote', `Orphan: ${slice.message}`));
    }
    if (slice.hosts.length) {
      card.append(
        slice.num_slices > 1 ? this.sliceGroups(slice) : this.hostList(slice, slice.hosts, host => `host ${host.index}`)
      );
    }
    if (slice.services?.length || slice.forwards?.length) {
      card.append(servingList(slice, described));
    }
    return card;
  }

  /** A multislice's hosts under a sub-heading per slice, each named as the notebook's output names it (s1/0). */
  private sliceGroups(slice: ISlice): HTMLElement {
    const groups = el('div', 'jp-tpunb-SliceGroups');
    for (let index = 0; index < slice.num_slices; index++) {
      const group = el('div', 'jp-tpunb-SliceGroup');
      group.dataset.sliceIndex = String(index);
      const hosts = slice.hosts.filter(host => host.slice_index === index);
      group.append(el('div', 'jp-tpunb-SliceHeading', `slice ${index}`), this.hostList(slice, hosts, host => host.label));
      groups.append(group);
    }
    return groups;
  }

  private hostList(slice: ISlice, hosts: IHost[], name: (host: IHost) => string): HTMLElement {
    const list = el('ul', 'jp-tpunb-Hosts');
    list.append(...hosts.map(host => this.hostRow(slice, host, name(host))));
    return list;
  }

  private hostRow(slice: ISlice, host: IHost, name: string): HTMLElement {
    const row = el('li', `jp-tpunb-Host jp-tpunb-host-${host.state.replace(/\W+/g, '-')}`);
    row.dataset.host = String(host.index);
    const stacks = el('button', 'jp-tpunb-StacksButton jp-Button jp-mod-minimal', 'stacks');
    stacks.title = `Where ${name} is: every thread's Python stack (also while a cell runs, or hangs)`;
    stacks.onclick = () => void this.showStacks(slice, host, name);
    row.append(el('span', 'jp-tpunb-HostName', name), el('span', 'jp-tpunb-HostState', host.state), stacks);
    const bars = el('div', 'jp-tpunb-Bars');
    for (const [key, label] of METRICS) {
      const shown = describeMetric(key, label, host.metrics ?? {});
      const bar = el('div', 'jp-tpunb-Bar');
      bar.dataset.metric = key;
      const fill = el('div', 'jp-tpunb-BarFill');
      const percent = shown.fraction === undefined ? 0 : Math.min(100, Math.max(0, shown.fraction * 100));
      fill.style.width = `${percent.toFixed(1)}%`;
      if (percent > 0) {
        fill.style.minWidth = '2px'; // a simulated host's few MB of 24 GB still shows
      }
      bar.append(fill);
      bar.title = shown.title;
      const text = el('span', 'jp-tpunb-BarValue', shown.text);
      text.dataset.metric = key;
      text.title = shown.title;
      bars.append(el('span', 'jp-tpunb-BarLabel', label), bar, text);
    }
    row.append(bars);
    return row;
  }

  /** A host's stacks, read by the server from outside its (maybe busy) kernel, in a dialog. */
  private async showStacks(slice: ISlice, host: IHost, name: string): Promise<void> {
    let reply: IStacks;
    try {
      reply = await requestAPI<IStacks>(`slices/${encodeURIComponent(slice.name)}/stacks?hosts=${host.index}`);
    } catch (error) {
      await showErrorMessage(`Cannot read the stacks of ${slice.name} ${name}`, (error as Error).message);
      return;
    }
    const body = new Widget();
    body.node.append(el('pre', 'jp-tpunb-Stacks', reply.text));
    await showDialog({ title: `${slice.name} ${name}: where it is`, body, buttons: [Dialog.okButton({ label: 'Close' })] });
  }

  private async confirmDelete(slice: ISlice): Promise<void> {
    const ends = this.backends.get(slice.backend)?.ends ?? "its {hosts} hosts' processes end";
    const what = ends.replace('{hosts}', String(slice.hosts.length));
    const result = await showDialog({
      title: `Delete ${slice.name}?`,
      body: `${slice.accelerator} on ${slice.backend}: ${what}.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!result.button.accept) {
      return;
    }
    try {
      // the answer is the view after the delete: draw it, no second request
      this.render(await requestAPI<IDeleted>(`slices/${encodeURIComponent(slice.name)}`, { method: 'DELETE' }));
      this.statusLine.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      await showErrorMessage(`Cannot delete ${slice.name}`, (error as Error).message);
      await this.poll.refresh();
    }
  }

  private buildLaunchForm(): HTMLElement {
    const form = el('form', 'jp-tpunb-Launch');
    const heading = el('h3', '', 'Launch in the active notebook');
    const accelerator = el('input', 'jp-mod-styled jp-tpunb-Accelerator');
    Object.assign(accelerator, { name: 'accelerator', placeholder: 'v4-16', required: true, value: 'v4-16' });
    accelerator.setAttribute('list', 'tpunb-accelerators');
    accelerator.setAttribute('aria-label', 'accelerator');
    const backend = el('select', 'jp-mod-styled jp-tpunb-BackendSelect');
    backend.name = 'backend';
    backend.title = 'auto: Cloud TPU when a Google Cloud project is configured, else a local simulated slice';
    const auto = el('option', '', 'backend: auto');
    auto.value = '';
    backend.append(auto); // the backends %tpu_launch makes follow, as the server lists them (loadCatalog)
    this.backendMenu = backend;
    const zone = el('input', 'jp-mod-styled jp-tpunb-Zone');
    Object.assign(zone, { name: 'zone', placeholder: 'zone (Cloud TPU)' });
    zone.setAttribute('list', 'tpunb-zones');
    zone.setAttribute('aria-label', 'zone');
    const spot = el('input', 'jp-tpunb-Spot');
    spot.type = 'checkbox';
    const spotLabel = el('label', 'jp-tpunb-SpotLabel');
    spotLabel.append(spot, document.createTextNode(' spot'));
    const slices = el('input', 'jp-mod-styled jp-tpunb-Slices');
    Object.assign(slices, { name: 'slices', type: 'number', min: '1', step: '1', value: '1' });
    slices.title = 'slices joined in one JAX job: 2 or more make a multislice (--slices N)';
    const slicesLabel = el('label', 'jp-tpunb-SlicesLabel', 'slices ');
    slicesLabel.append(slices);
    const submit = el('button', 'jp-mod-styled jp-mod-accept jp-tpunb-LaunchButton', 'Launch');
    submit.type = 'submit';
    const formError = el('div', 'jp-tpunb-FormError');
    this.acceleratorList.id = 'tpunb-accelerators';
    this.zoneList.id = 'tpunb-zones';
    form.noValidate = true; // our own one-line messages, not the browser's bubbles
    form.append(heading, accelerator, backend, zone, spotLabel, slicesLabel, formError, submit);
    form.append(this.acceleratorList, this.zoneList);
    form.onsubmit = event => {
      event.preventDefault();
      formError.textContent = '';
      let code: string;
      try {
        code = launchCommand({
          accelerator: parseAccelerator(accelerator.value),
          backend: backend.value,
          zone: zone.value,
          spot: spot.checked,
          slices: parseSlices(slices.value)
        });
      } catch (error) {
        formError.textContent = (error as Error).message;
        return;
      }
      void launchInNotebook(this.tracker, this.shell, code).then(() => this.poll.refresh());
    };
    return form;
  }

  private async loadCatalog(): Promise<void> {
    try {
      const catalog = await requestAPI<ICatalog>('catalog');
      fillDatalist(this.acceleratorList, catalog.accelerators);
      fillDatalist(this.zoneList, catalog.zones);
      for (const described of catalog.backends) {
        this.backends.set(described.name, described);
        if (described.launch) {
          const option = el('option', '', `backend: ${described.label}`);
          option.value = described.name;
          this.backendMenu?.append(option);
        }
      }
    } catch (error) {
      this.errorLine.textContent = `${(error as Error).message}`;
    }
  }

  private readonly poll: Poll;
  private readonly catalogLoaded: Promise<void>;
  private readonly backends = new Map<string, IBackend>();
  private backendMenu: HTMLSelectElement | null = null;
  private readonly cards = el('div');
  private readonly snapshots = el('div', 'jp-tpunb-SnapshotsBox');
  private readonly errorLine = el('div');
  private readonly statusLine = el('span', 'jp-tpunb-Updated');
  private readonly acceleratorList = el('datalist');
  private readonly zoneList = el('datalist');
}
