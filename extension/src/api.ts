import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A host of a slice as GET /tpunb/api/slices reports it. */
export interface IHost {
  index: number;
  /** Which slice of a multislice the host is in (0 for a single slice). */
  slice_index: number;
  /** The host's name in the notebook's output: '3', or 's1/0' (host 0 of slice 1) in a multislice. */
  label: string;
  address: string;
  state: string;
  /** Latest samples: the bars as 0..1 fractions (cpu, memory, hbm) and the raw values (memory_total_bytes,
   * hbm_used_bytes, ...); empty until kernels publish them. */
  metrics: { [key: string]: number };
}

/** A service on one host of a slice (tpunb.status.ServiceRow). */
export interface IService {
  service: string;
  host: number;
  /** One wording: starting, ready, running, restarting (restart N), exited with code N, gave up after ... */
  state: string;
  restarts: number;
  exit_code: number | null;
  command: string;
  /** Where it answers (--port, --wait-port or --wait-http), or null. */
  port: number | null;
  /** It runs: it keeps the slice busy (no idle delete) and billing. */
  busy: boolean;
  usd_per_hour: number | null;
}

/** A port forward a live kernel holds (tpunb.status.ForwardRow). */
export interface IForward {
  host: number;
  port: number;
  /** On the kernel's machine: http://127.0.0.1:L/ */
  url: string;
  local_port: number;
  /** With jupyter-server-proxy: 'proxy/L/' under the Jupyter server's base URL (works from any browser). */
  proxy: string | null;
}

/** A slice (or an orphaned cloud node) as GET /tpunb/api/slices reports it. */
export interface ISlice {
  name: string;
  backend: string;
  /** What it is: 'v4-16', or '2 x v4-16' for a multislice. */
  accelerator: string;
  /** Slices joined in one JAX job: 1 for a single slice. */
  num_slices: number;
  state: string;
  age_s: number | null;
  spot: boolean;
  usd_per_hour: number | null;
  usd_so_far: number | null;
  list_usd_per_hour?: number | null;
  hosts: IHost[];
  services?: IService[];
  forwards?: IForward[];
  /** Names of the services that run: while one does, the slice is busy (and bills). */
  busy_services?: string[];
  /** Seconds until its idle watchdog deletes the node (null: no idle autodelete, or kept busy). */
  idle_delete_in?: number | null;
  /** "idle delete failing: 403 ...": the watchdog cannot delete the node (shown instead of a countdown). */
  idle_delete_failing?: string | null;
  orphan: boolean;
  message?: string;
}

/** A snapshot this machine knows (tpunb.status.SnapshotRow): it outlives the slice it came from. */
export interface ISnapshot {
  /** The slice it was taken from. */
  slice: string | null;
  /** The variables it holds: 'params, step'. */
  names: string;
  /** The slice it came from: 'v4-16 (2 hosts, 8 devices)'. */
  shape: string;
  size_bytes: number | null;
  age_s: number | null;
  /** 'local' (a folder on the notebook's machine) or 'gs' (Cloud Storage: it costs money while it exists). */
  where: string;
  complete: boolean;
  /** The folder, or gs://BUCKET/PATH. */
  uri: string;
}

/** GET /tpunb/api/slices: the status view as JSON (tpunb.overview.StatusView.to_json). */
export interface ISlices {
  slices: ISlice[];
  orphans: ISlice[];
  snapshots?: ISnapshot[];
  /** Why snapshots on Cloud Storage are missing (a bucket that cannot be read), one line. */
  snapshots_error?: string | null;
}

/** DELETE /tpunb/api/slices/NAME: the fresh view after the delete, and what was deleted. */
export interface IDeleted extends ISlices {
  deleted: string[];
  messages: string[];
}

/** GET /tpunb/api/slices/NAME/stacks?hosts=H: where the hosts are (tpunb.server.model.stacks). */
export interface IStacks {
  name: string;
  /** Every thread's stack, grouped by identical stacks with host ranges, as %tpu_stacks prints it. */
  text: string;
  seconds: number;
  /** Per host: where its main thread is in one line, or why its stacks could not be read. */
  hosts: { [host: string]: { where: string; error: string; state: string } };
}

/** A backend as the server describes it (tpunb.provision.describe): the panel names no backend itself. */
export interface IBackend {
  name: string;
  /** 'local (simulated)', 'gcp (Cloud TPU)'. */
  label: string;
  /** Its hosts run on the notebook's machine: nothing bills. */
  free: boolean;
  /** What deleting one of its slices does; {hosts}: how many hosts it has. */
  ends: string;
  /** %tpu_launch makes slices of it (the launch form offers it). */
  launch: boolean;
}

export interface ICatalog {
  accelerators: string[];
  zones: string[];
  backends: IBackend[];
  default_backend: string;
}

/** Call the tpunb server extension; a failure throws an Error carrying the server's one-line message. */
export async function requestAPI<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'tpunb', 'api', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new Error(`cannot reach the Jupyter server: ${error}`);
  }
  const text = await response.text();
  let data: any = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch {
    data = {}; // not JSON: an HTML error page from outside tpunb's handlers
  }
  if (!response.ok) {
    const hint =
      response.status === 404 && !data.message
        ? 'the tpunb server extension is not loaded: reinstall tpunb[lab] and restart JupyterLab'
        : data.message || response.statusText;
    throw new Error(hint);
  }
  return data as T;
}
