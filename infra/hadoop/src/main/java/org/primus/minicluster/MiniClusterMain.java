package org.primus.minicluster;

import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.net.NetUtils;
import org.apache.hadoop.util.ShutdownHookManager;
import org.apache.hadoop.util.VersionInfo;
import org.apache.hadoop.yarn.api.records.NodeState;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.resourcemanager.ResourceManager;
import org.apache.hadoop.yarn.server.resourcemanager.rmnode.RMNode;
import org.apache.hadoop.yarn.webapp.util.WebAppUtils;
import sun.misc.Signal;

/**
 * A real HDFS (MiniDFSCluster: NameNode with WebHDFS, DataNodes) and/or a real YARN
 * (MiniYARNCluster: ResourceManager with its REST web app, NodeManagers that launch containers as
 * processes through DefaultContainerExecutor) in one JVM, every server on 127.0.0.1 and free ports.
 *
 * <pre>
 * java -Xmx768m -cp 'JARS/*' org.primus.minicluster.MiniClusterMain --dfs --yarn \
 *     --nodemanagers 2 --nm-vcores 4 --nm-memory-mb 2048 --base-dir DIR --info-file FILE [-D key=value]...
 * </pre>
 *
 * Once every server is up (DataNodes registered, NodeManagers RUNNING) it writes client configs
 * (core-site.xml, hdfs-site.xml, yarn-site.xml) into {@code DIR/conf} and then, atomically, the
 * JSON info file. SIGTERM/SIGINT stop YARN, then HDFS, and remove the info file.
 *
 * Everything lands under the base dir: HDFS in {@code dfs/}, the NodeManagers' local and log
 * dirs (container logs) in {@code test-data/primus-yarn/}, Jetty's temp dirs in {@code tmp/}
 * (unless {@code -Djava.io.tmpdir} is given).
 */
public final class MiniClusterMain {
  private static final String LOOPBACK = "127.0.0.1";
  private static final String ANY_PORT = LOOPBACK + ":0";

  private boolean dfs;
  private boolean yarn;
  private int nodeManagers = 2;
  private int dataNodes = 1;
  private int nmVcores = 4;
  private int nmMemoryMb = 2048;
  private Path baseDir;
  private Path infoFile;
  private Path confDir;
  private final Map<String, String> overrides = new LinkedHashMap<>();

  private MiniDFSCluster dfsCluster;
  private MiniYARNCluster yarnCluster;
  private volatile boolean stopped;

  public static void main(String[] args) throws Exception {
    MiniClusterMain main = new MiniClusterMain();
    try {
      main.parse(args);
    } catch (IllegalArgumentException e) {
      System.err.println("minicluster: " + e.getMessage());
      System.err.println(usage());
      System.exit(2);
    }
    // SIGTERM/SIGINT stop the servers on the main thread, before the JVM's shutdown begins
    // (MiniDFSCluster.shutdown removes shutdown hooks, which a shutdown hook may not do).
    CountDownLatch stopRequested = new CountDownLatch(1);
    for (String name : new String[] {"TERM", "INT"}) {
      Signal.handle(new Signal(name), signal -> stopRequested.countDown());
    }
    // Any other exit still stops them; Hadoop's own hooks (FileSystem cache: 10) run after.
    ShutdownHookManager.get().addShutdownHook(main::stop, 100);
    try {
      main.start();
    } catch (Throwable t) {
      System.err.println("minicluster: start-up failed: " + t);
      t.printStackTrace();
      main.stop();
      System.exit(1);
    }
    stopRequested.await();
    // MiniYARNCluster.stop() can hang on threads it never joins (seen: 30 s and more after
    // "stopping"): give it a bounded time, then end the JVM without running the hooks again.
    Thread stopper = new Thread(main::stop, "minicluster-stop");
    stopper.setDaemon(true);
    stopper.start();
    stopper.join(STOP_GRACE_MS);
    if (stopper.isAlive()) {
      log("stop did not finish within " + STOP_GRACE_MS + " ms; halting");
    }
    System.out.flush();
    System.err.flush();
    Runtime.getRuntime().halt(0);
  }

  private static final long STOP_GRACE_MS = 10_000;

  static String usage() {
    return "usage: MiniClusterMain [--dfs] [--yarn] [--nodemanagers N] [--datanodes N] [--nm-vcores V]"
        + " [--nm-memory-mb M] --base-dir DIR --info-file FILE [--conf-dir DIR] [-D key=value]...";
  }

  void parse(String[] args) {
    for (int i = 0; i < args.length; i++) {
      String arg = args[i];
      switch (arg) {
        case "--dfs" -> dfs = true;
        case "--yarn" -> yarn = true;
        case "--nodemanagers" -> nodeManagers = positive(arg, value(args, ++i, arg));
        case "--datanodes" -> dataNodes = positive(arg, value(args, ++i, arg));
        case "--nm-vcores" -> nmVcores = positive(arg, value(args, ++i, arg));
        case "--nm-memory-mb" -> nmMemoryMb = positive(arg, value(args, ++i, arg));
        case "--base-dir" -> baseDir = Paths.get(value(args, ++i, arg)).toAbsolutePath();
        case "--info-file" -> infoFile = Paths.get(value(args, ++i, arg)).toAbsolutePath();
        case "--conf-dir" -> confDir = Paths.get(value(args, ++i, arg)).toAbsolutePath();
        case "-D" -> define(value(args, ++i, arg));
        case "-h", "--help" -> {
          System.out.println(usage());
          System.exit(0);
        }
        default -> {
          if (arg.startsWith("-D") && arg.length() > 2) {
            define(arg.substring(2));
          } else {
            throw new IllegalArgumentException("unknown argument " + arg);
          }
        }
      }
    }
    if (!dfs && !yarn) {
      throw new IllegalArgumentException("nothing to start: give --dfs and/or --yarn");
    }
    if (baseDir == null || infoFile == null) {
      throw new IllegalArgumentException("--base-dir and --info-file are required");
    }
    if (confDir == null) {
      confDir = baseDir.resolve("conf");
    }
  }

  private static String value(String[] args, int i, String flag) {
    if (i >= args.length) {
      throw new IllegalArgumentException(flag + " needs a value");
    }
    return args[i];
  }

  private static int positive(String flag, String text) {
    try {
      int n = Integer.parseInt(text);
      if (n > 0) {
        return n;
      }
    } catch (NumberFormatException ignored) {
      // reported below
    }
    throw new IllegalArgumentException(flag + ": expected a positive integer, found " + text);
  }

  private void define(String kv) {
    int eq = kv.indexOf('=');
    if (eq <= 0) {
      throw new IllegalArgumentException("-D " + kv + ": expected key=value");
    }
    overrides.put(kv.substring(0, eq), kv.substring(eq + 1));
  }

  void start() throws Exception {
    long t0 = System.nanoTime();
    Files.createDirectories(baseDir);
    Files.deleteIfExists(infoFile);
    System.setProperty("test.build.data", baseDir.resolve("test-data").toString());
    boolean tmpdirGiven = ManagementFactory.getRuntimeMXBean().getInputArguments().stream()
        .anyMatch(a -> a.startsWith("-Djava.io.tmpdir="));
    if (!tmpdirGiven) { // Jetty unpacks each web app there and does not always clean up
      Path tmp = Files.createDirectories(baseDir.resolve("tmp"));
      System.setProperty("java.io.tmpdir", tmp.toString());
    }

    Configuration conf = new HdfsConfiguration();
    conf.set("hadoop.tmp.dir", baseDir.resolve("tmp").toString());
    // The HTTP servers' cookie-signing secret (default: a file in $HOME, which is not there).
    Path secret = baseDir.resolve("http-signature-secret");
    if (!Files.exists(secret)) {
      Files.write(secret, UUID.randomUUID().toString().getBytes(StandardCharsets.UTF_8));
    }
    conf.set("hadoop.http.authentication.signature.secret.file", secret.toString());
    // Small thread pools: the tests run on two cores.
    conf.setInt("hadoop.http.max.threads", 20);
    String namenodeRpc = null;
    String webhdfs = null;
    if (dfs) {
      File dfsBase = baseDir.resolve("dfs").toFile();
      conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, dfsBase.getAbsolutePath());
      conf.setBoolean("dfs.permissions.enabled", false); // any test user may write anywhere
      conf.setInt("dfs.replication", 1);
      conf.setBoolean("dfs.webhdfs.enabled", true);
      conf.setInt("dfs.namenode.handler.count", 4);
      conf.setInt("dfs.namenode.service.handler.count", 2);
      conf.setInt("dfs.datanode.handler.count", 2);
      conf.setInt("dfs.namenode.metrics.logger.period.seconds", 0);
      conf.setInt("dfs.datanode.metrics.logger.period.seconds", 0);
      conf.setInt("dfs.namenode.safemode.extension", 0);
      conf.set("dfs.datanode.hostname", LOOPBACK);
      applyOverrides(conf);
      dfsCluster = new MiniDFSCluster.Builder(conf, dfsBase)
          .numDataNodes(dataNodes)
          .nameNodePort(0)
          .nameNodeHttpPort(0)
          .format(true)
          .checkExitOnShutdown(false)
          .waitSafeMode(true)
          .build();
      dfsCluster.waitActive();
      namenodeRpc = "hdfs://" + LOOPBACK + ":" + dfsCluster.getNameNodePort();
      InetSocketAddress http = dfsCluster.getNameNode().getHttpAddress();
      webhdfs = "http://" + LOOPBACK + ":" + http.getPort();
      conf = new Configuration(dfsCluster.getConfiguration(0));
      conf.set("fs.defaultFS", namenodeRpc);
      log("HDFS up: rpc " + namenodeRpc + ", http " + webhdfs);
    }

    String rmAddress = null;
    String rmScheduler = null;
    String rmTracker = null;
    String rmAdmin = null;
    String rmWeb = null;
    if (yarn) {
      YarnConfiguration yconf = new YarnConfiguration(conf);
      // Fixed ports: every address below is taken as given, so all servers bind to loopback
      // (otherwise MiniYARNCluster uses the machine's host name) on a port the OS picks.
      yconf.setBoolean(YarnConfiguration.YARN_MINICLUSTER_FIXED_PORTS, true);
      yconf.set(YarnConfiguration.RM_HOSTNAME, LOOPBACK);
      for (String key : new String[] {
          YarnConfiguration.RM_ADDRESS, YarnConfiguration.RM_SCHEDULER_ADDRESS,
          YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS, YarnConfiguration.RM_ADMIN_ADDRESS,
          YarnConfiguration.RM_WEBAPP_ADDRESS, YarnConfiguration.NM_ADDRESS,
          YarnConfiguration.NM_LOCALIZER_ADDRESS, YarnConfiguration.NM_WEBAPP_ADDRESS}) {
        yconf.set(key, ANY_PORT);
      }
      yconf.setInt(YarnConfiguration.YARN_MINICLUSTER_NM_PMEM_MB, nmMemoryMb);
      yconf.setInt(YarnConfiguration.NM_PMEM_MB, nmMemoryMb);
      yconf.setInt(YarnConfiguration.NM_VCORES, nmVcores);
      yconf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, Math.min(64, nmMemoryMb));
      yconf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, nmMemoryMb);
      yconf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_VCORES, 1);
      yconf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, nmVcores);
      yconf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
      // No capacity-scheduler.xml ships in the jars: one queue, "default", with everything;
      // AMs may take half of it (the 10 % default starves small clusters); vcores count too.
      yconf.set("yarn.scheduler.capacity.root.queues", "default");
      yconf.set("yarn.scheduler.capacity.root.default.capacity", "100");
      yconf.set("yarn.scheduler.capacity.root.default.maximum-capacity", "100");
      yconf.set("yarn.scheduler.capacity.maximum-am-resource-percent", "0.5");
      yconf.set("yarn.scheduler.capacity.resource-calculator",
          "org.apache.hadoop.yarn.util.resource.DominantResourceCalculator");
      yconf.set(YarnConfiguration.NM_CONTAINER_EXECUTOR,
          "org.apache.hadoop.yarn.server.nodemanager.DefaultContainerExecutor");
      // A nearly full test disk must not mark the NodeManagers unhealthy.
      yconf.setFloat(YarnConfiguration.NM_MAX_PER_DISK_UTILIZATION_PERCENTAGE, 99.9f);
      yconf.setLong(YarnConfiguration.NM_MIN_PER_DISK_FREE_SPACE_MB, 0);
      yconf.setInt(YarnConfiguration.RM_CLIENT_THREAD_COUNT, 4);
      yconf.setInt(YarnConfiguration.RM_SCHEDULER_CLIENT_THREAD_COUNT, 4);
      yconf.setInt(YarnConfiguration.RM_RESOURCE_TRACKER_CLIENT_THREAD_COUNT, 4);
      yconf.setInt(YarnConfiguration.RM_ADMIN_CLIENT_THREAD_COUNT, 1);
      yconf.setInt(YarnConfiguration.NM_CONTAINER_MGR_THREAD_COUNT, 4);
      yconf.setInt(YarnConfiguration.NM_DELETE_THREAD_COUNT, 1);
      yconf.setInt(YarnConfiguration.NM_LOCALIZER_FETCH_THREAD_COUNT, 2);
      yconf.setInt(YarnConfiguration.NM_LOCALIZER_CLIENT_THREAD_COUNT, 2);
      applyOverrides(yconf);
      yarnCluster = new MiniYARNCluster("primus-yarn", 1, nodeManagers, 1, 1);
      yarnCluster.init(yconf);
      yarnCluster.start();
      if (!yarnCluster.waitForNodeManagersToConnect(60_000)) {
        throw new IllegalStateException("NodeManagers did not register with the ResourceManager in 60 s");
      }
      ResourceManager rm = yarnCluster.getResourceManager();
      waitNodesRunning(rm, nodeManagers, 60_000);
      Configuration rmConf = rm.getConfig();
      rmAddress = hostPort(rm.getClientRMService().getBindAddress());
      rmScheduler = hostPort(rm.getApplicationMasterService().getBindAddress());
      rmTracker = rmConf.get(YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS);
      rmAdmin = rmConf.get(YarnConfiguration.RM_ADMIN_ADDRESS);
      // The RM writes the web app's real port back into its configuration once it listens.
      rmWeb = "http://" + hostPort(NetUtils.createSocketAddr(WebAppUtils.getRMWebAppURLWithoutScheme(rmConf)));
      log("YARN up: rm " + rmAddress + ", web " + rmWeb + ", " + nodeManagers + " NodeManagers");
      conf = yconf;
      Map<String, String> yarnSite = new LinkedHashMap<>();
      yarnSite.put(YarnConfiguration.RM_HOSTNAME, LOOPBACK);
      yarnSite.put(YarnConfiguration.RM_ADDRESS, rmAddress);
      yarnSite.put(YarnConfiguration.RM_SCHEDULER_ADDRESS, rmScheduler);
      yarnSite.put(YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS, rmTracker);
      yarnSite.put(YarnConfiguration.RM_ADMIN_ADDRESS, rmAdmin);
      yarnSite.put(YarnConfiguration.RM_WEBAPP_ADDRESS, rmWeb.substring("http://".length()));
      yarnSite.put(YarnConfiguration.NM_VMEM_CHECK_ENABLED, "false");
      yarnSite.put(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, String.valueOf(Math.min(64, nmMemoryMb)));
      yarnSite.put(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, String.valueOf(nmMemoryMb));
      yarnSite.put(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, String.valueOf(nmVcores));
      writeSite("yarn-site.xml", yarnSite);
    }

    Map<String, String> core = new LinkedHashMap<>();
    core.put("fs.defaultFS", namenodeRpc != null ? namenodeRpc : "file:///");
    writeSite("core-site.xml", core);
    if (dfs) {
      Map<String, String> hdfs = new LinkedHashMap<>();
      hdfs.put("dfs.namenode.rpc-address", namenodeRpc.substring("hdfs://".length()));
      hdfs.put("dfs.namenode.http-address", webhdfs.substring("http://".length()));
      hdfs.put("dfs.replication", "1");
      hdfs.put("dfs.webhdfs.enabled", "true");
      hdfs.put("dfs.permissions.enabled", "false");
      writeSite("hdfs-site.xml", hdfs);
    }

    Map<String, Object> info = new LinkedHashMap<>();
    info.put("namenode_rpc", namenodeRpc);
    info.put("webhdfs", webhdfs);
    info.put("rm_web", rmWeb);
    info.put("rm_address", rmAddress);
    info.put("rm_scheduler_address", rmScheduler);
    info.put("conf_dir", confDir.toString());
    info.put("base_dir", baseDir.toString());
    info.put("datanodes", dfs ? dataNodes : 0);
    info.put("nodemanagers", yarn ? nodeManagers : 0);
    info.put("nm_vcores", yarn ? nmVcores : 0);
    info.put("nm_memory_mb", yarn ? nmMemoryMb : 0);
    info.put("hadoop_version", VersionInfo.getVersion());
    info.put("pid", ProcessHandle.current().pid());
    info.put("startup_seconds", Math.round((System.nanoTime() - t0) / 1e7) / 100.0);
    writeAtomically(infoFile, (json(info) + "\n").getBytes(StandardCharsets.UTF_8));
    log("ready in " + info.get("startup_seconds") + " s; info in " + infoFile);
  }

  private void applyOverrides(Configuration conf) {
    overrides.forEach(conf::set);
  }

  private static void waitNodesRunning(ResourceManager rm, int wanted, long timeoutMs) throws InterruptedException {
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (true) {
      int running = 0;
      for (RMNode node : rm.getRMContext().getRMNodes().values()) {
        if (node.getState() == NodeState.RUNNING) {
          running++;
        }
      }
      if (running >= wanted) {
        return;
      }
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException(running + " of " + wanted + " NodeManagers RUNNING after " + timeoutMs + " ms");
      }
      Thread.sleep(100);
    }
  }

  private static String hostPort(InetSocketAddress address) {
    if (address.getPort() <= 0) {
      throw new IllegalStateException("server address " + address + " has no port yet");
    }
    return LOOPBACK + ":" + address.getPort();
  }

  private void writeSite(String name, Map<String, String> properties) throws IOException {
    Configuration site = new Configuration(false);
    properties.forEach(site::set);
    Files.createDirectories(confDir);
    Path tmp = Files.createTempFile(confDir, name, ".tmp");
    try (OutputStream out = Files.newOutputStream(tmp)) {
      site.writeXml(out);
    }
    Files.move(tmp, confDir.resolve(name), StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
  }

  private static void writeAtomically(Path target, byte[] data) throws IOException {
    Path dir = target.toAbsolutePath().getParent();
    Files.createDirectories(dir);
    Path tmp = Files.createTempFile(dir, target.getFileName().toString(), ".tmp");
    Files.write(tmp, data);
    Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
  }

  synchronized void stop() {
    if (stopped) {
      return;
    }
    stopped = true;
    log("stopping");
    try {
      if (infoFile != null) {
        Files.deleteIfExists(infoFile);
      }
    } catch (IOException e) {
      log("cannot remove " + infoFile + ": " + e);
    }
    if (yarnCluster != null) {
      try {
        yarnCluster.stop();
      } catch (Throwable t) {
        log("YARN stop: " + t);
      }
    }
    if (dfsCluster != null) {
      try {
        dfsCluster.shutdown();
      } catch (Throwable t) {
        log("HDFS stop: " + t);
      }
    }
    log("stopped");
  }

  private static void log(String message) {
    System.err.println("minicluster: " + message);
    System.err.flush();
  }

  static String json(Map<String, Object> map) {
    StringBuilder out = new StringBuilder("{");
    List<String> items = new ArrayList<>();
    for (Map.Entry<String, Object> e : map.entrySet()) {
      items.add(quote(e.getKey()) + ": " + jsonValue(e.getValue()));
    }
    out.append(String.join(", ", items));
    return out.append('}').toString();
  }

  private static String jsonValue(Object value) {
    if (value == null) {
      return "null";
    }
    if (value instanceof Number || value instanceof Boolean) {
      return value.toString();
    }
    return quote(value.toString());
  }

  private static String quote(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }
}
